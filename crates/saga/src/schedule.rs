//! Schedules: a saga started on a calendar, stored in the database (`saga_schedules`)
//! and shared by every process of it.
//!
//! A [`Schedule`] names a saga, its input (a template that may receive the firing's
//! time), a cron expression (5 fields, or 6 with seconds first) in an IANA time zone,
//! what to do when the previous firing's saga still runs ([`Overlap`]), what to do
//! with the times missed while no process ran ([`CatchUp`]), a jitter bound, and
//! whether it is paused. Each time the expression names is a *slot*; a firing starts
//! its saga under the start key `schedule:<name>:<slot ms>`, in the transaction that
//! moves the schedule to its next slot, so each slot starts at most one saga whichever
//! process fires it, and a crash before the commit fires it again, once.
//!
//! ```
//! use std::time::Duration;
//! use agentsaga_saga::schedule::{CatchUp, Overlap, Schedule};
//!
//! let brief = Schedule::new("morning-brief", "research", "0 7 * * MON-FRI")
//!     .time_zone("Europe/Paris")
//!     .input(serde_json::json!({ "topic": "news", "at": { "$fire_time": "rfc3339" } }))
//!     .overlap(Overlap::Skip)
//!     .catch_up(CatchUp::Latest)
//!     .jitter(Duration::from_secs(30));
//! assert!(brief.check().is_ok());
//! assert!(Schedule::new("bad", "research", "0 25 * * *").check().is_err());
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::{Error, MAX_KEY_BYTES, Result, SagaId};

mod calendar;
mod fire;
mod table;

pub(crate) use calendar::Calendar;
pub use fire::{Fired, Firings};
pub use table::{create, delete, get, list, pause, put, resume};

/// The most slots one catch-up ([`CatchUp::All`]) fires.
pub const MAX_CATCH_UP: u32 = 1_000;

/// The longest jitter a schedule may have (one day).
pub const MAX_JITTER: Duration = Duration::from_secs(86_400);

/// The longest schedule name: its slots' start keys must fit [`MAX_KEY_BYTES`].
pub const MAX_NAME_BYTES: usize = MAX_KEY_BYTES - 32;

/// What a firing does while the saga of the schedule's previous firing still runs
/// (running or compensating; a stuck saga has stopped and does not count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Skip the slot (counted in `skipped`). The default.
    #[default]
    Skip,
    /// Keep one slot waiting and fire it when the running saga ends; a later slot
    /// replaces it (the replaced one is skipped).
    QueueOne,
    /// Start anyway: firings may run side by side.
    Allow,
}

/// What a schedule does with slots missed while no process fired it (a process down,
/// a database away): a slot is missed when it is found more than `late_after` (plus
/// the jitter bound) past its time. Slots found in time always fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case", tag = "policy")]
pub enum CatchUp {
    /// Missed slots do not fire. The default.
    #[default]
    None,
    /// The latest missed slot fires, unless a slot in time fires anyway.
    Latest,
    /// Every missed slot fires, oldest first, but at most the latest `max` of them
    /// (1 to [`MAX_CATCH_UP`]). Overlap still applies: with [`Overlap::Skip`] the
    /// first starts and the others are skipped while it runs; use
    /// [`Overlap::Allow`] to run each.
    All {
        /// The bound.
        max: u32,
    },
}

/// A schedule: which saga starts, with what, and when (see the [module](self)).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Schedule {
    /// Its name, unique in the database (1 to [`MAX_NAME_BYTES`] bytes).
    pub name: String,
    /// The saga it starts (its newest version registered where it fires).
    pub saga: String,
    /// The saga's input. Any object `{"$fire_time": "rfc3339"}` or
    /// `{"$fire_time": "unix_ms"}` in it is replaced by the slot's time, as RFC 3339
    /// text (UTC) or Unix milliseconds. Default `null`.
    pub input: Value,
    /// A cron expression: 5 fields (minute first) or 6 (second first).
    pub cron: String,
    /// An IANA time zone the expression reads in (default `UTC`).
    pub time_zone: String,
    /// While the previous firing runs.
    pub overlap: Overlap,
    /// After downtime.
    pub catch_up: CatchUp,
    /// How late a slot may be found and still fire as in time (default 1 minute).
    #[serde(with = "millis")]
    pub late_after: Duration,
    /// Each slot fires up to this much after its time, at random (default none;
    /// at most [`MAX_JITTER`]), so that many schedules on one time spread out.
    #[serde(with = "millis")]
    pub jitter: Duration,
    /// A paused schedule fires nothing; resumed, it goes on from its next slot.
    pub paused: bool,
}

mod millis {
    pub(super) fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

impl Schedule {
    /// A schedule `name` that starts saga `saga` at the times `cron` names, in UTC,
    /// with input `null`, [`Overlap::Skip`], [`CatchUp::None`], no jitter.
    pub fn new(name: impl Into<String>, saga: impl Into<String>, cron: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            saga: saga.into(),
            input: Value::Null,
            cron: cron.into(),
            time_zone: "UTC".into(),
            overlap: Overlap::default(),
            catch_up: CatchUp::default(),
            late_after: Duration::from_secs(60),
            jitter: Duration::ZERO,
            paused: false,
        }
    }

    /// Sets [`input`](Self::input).
    #[must_use]
    pub fn input(mut self, input: Value) -> Self {
        self.input = input;
        self
    }

    /// Sets [`time_zone`](Self::time_zone).
    #[must_use]
    pub fn time_zone(mut self, tz: impl Into<String>) -> Self {
        self.time_zone = tz.into();
        self
    }

    /// Sets [`overlap`](Self::overlap).
    #[must_use]
    pub fn overlap(mut self, overlap: Overlap) -> Self {
        self.overlap = overlap;
        self
    }

    /// Sets [`catch_up`](Self::catch_up).
    #[must_use]
    pub fn catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// Sets [`late_after`](Self::late_after).
    #[must_use]
    pub fn late_after(mut self, late_after: Duration) -> Self {
        self.late_after = late_after;
        self
    }

    /// Sets [`jitter`](Self::jitter).
    #[must_use]
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets [`paused`](Self::paused).
    #[must_use]
    pub fn paused(mut self, paused: bool) -> Self {
        self.paused = paused;
        self
    }

    /// Checks everything that can be checked without the saga's definition: the name,
    /// the expression and the time zone, the template, the bounds.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] saying what is wrong.
    pub fn check(&self) -> Result<()> {
        self.calendar().map(|_| ())
    }

    /// [`check`](Self::check), and the calendar it makes.
    pub(crate) fn calendar(&self) -> Result<Calendar> {
        let bad = |reason: String| Error::InvalidSchedule {
            name: self.name.chars().take(64).collect(),
            reason,
        };
        if self.name.is_empty()
            || self.name.len() > MAX_NAME_BYTES
            || self.name.chars().any(char::is_control)
        {
            return Err(bad(format!(
                "a schedule's name is 1 to {MAX_NAME_BYTES} bytes, without control characters"
            )));
        }
        if self.saga.is_empty() || self.saga.chars().any(char::is_control) {
            return Err(bad(
                "its saga's name is empty or has control characters".into()
            ));
        }
        if !self.jitter.subsec_nanos().is_multiple_of(1_000_000)
            || !self.late_after.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(bad(
                "its jitter and late_after are whole milliseconds".into()
            ));
        }
        if self.jitter > MAX_JITTER {
            return Err(bad(format!(
                "its jitter is over {} s",
                MAX_JITTER.as_secs()
            )));
        }
        if self.late_after < Duration::from_secs(1) || self.late_after > MAX_JITTER {
            return Err(bad("its late_after is 1 s to 1 day".into()));
        }
        if let CatchUp::All { max } = self.catch_up
            && !(1..=MAX_CATCH_UP).contains(&max)
        {
            return Err(bad(format!("catch-up all takes 1 to {MAX_CATCH_UP} slots")));
        }
        fill(&self.input, 0).map_err(bad)?;
        Calendar::parse(&self.cron, &self.time_zone).map_err(bad)
    }
}

/// `template` with its `{"$fire_time": …}` objects replaced by `slot_ms`'s time (see
/// [`Schedule::input`]).
pub(crate) fn fill(template: &Value, slot_ms: i64) -> std::result::Result<Value, String> {
    Ok(match template {
        Value::Object(map) if map.contains_key("$fire_time") => {
            let as_time = || {
                jiff::Timestamp::from_millisecond(slot_ms)
                    .map(|t| Value::String(t.to_string()))
                    .map_err(|e| e.to_string())
            };
            match (map.len(), map.get("$fire_time").and_then(Value::as_str)) {
                (1, Some("rfc3339")) => as_time()?,
                (1, Some("unix_ms")) => Value::from(slot_ms),
                _ => {
                    return Err(
                        "`$fire_time` is an object of its own, `{\"$fire_time\": \"rfc3339\"}` \
                         or `{\"$fire_time\": \"unix_ms\"}`"
                            .into(),
                    );
                }
            }
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), fill(v, slot_ms)?)))
                .collect::<std::result::Result<_, String>>()?,
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| fill(v, slot_ms))
                .collect::<std::result::Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

/// A schedule as stored, with where it stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleView {
    /// What it is.
    #[serde(flatten)]
    pub schedule: Schedule,
    /// Its next slot, Unix ms (`None`: its expression names no time to come).
    pub next_slot_ms: Option<i64>,
    /// When that slot fires: the slot plus its jitter, Unix ms.
    pub next_due_ms: Option<i64>,
    /// A slot waiting for the previous firing's saga to end ([`Overlap::QueueOne`]).
    pub queued_slot_ms: Option<i64>,
    /// The last slot that started a saga, Unix ms.
    pub last_slot_ms: Option<i64>,
    /// The saga it started.
    pub last_saga_id: Option<SagaId>,
    /// When it fired, Unix ms.
    pub last_fired_ms: Option<i64>,
    /// Why its last firing could not start its saga (a saga name not registered, an
    /// input its saga refuses): that slot started nothing. Cleared by a firing that
    /// starts one.
    pub last_error: Option<String>,
    /// Slots that started a saga.
    pub fired: i64,
    /// Slots skipped by the overlap policy, or by a firing that could not start its
    /// saga (slots missed while no process fired are not counted).
    pub skipped: i64,
    /// Created, Unix ms.
    pub created_ms: i64,
    /// Last changed by an operator, Unix ms.
    pub updated_ms: i64,
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Skip => "skip",
            Self::QueueOne => "queue_one",
            Self::Allow => "allow",
        })
    }
}

impl FromStr for Overlap {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "skip" => Ok(Self::Skip),
            "queue_one" | "queue-one" => Ok(Self::QueueOne),
            "allow" => Ok(Self::Allow),
            _ => Err(format!(
                "`{s}` is no overlap policy (skip, queue_one, allow)"
            )),
        }
    }
}

impl CatchUp {
    /// Its name as stored (`none`, `latest`, `all`).
    pub fn policy(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Latest => "latest",
            Self::All { .. } => "all",
        }
    }
}

impl fmt::Display for CatchUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All { max } => write!(f, "all:{max}"),
            other => f.write_str(other.policy()),
        }
    }
}

impl FromStr for CatchUp {
    type Err = String;
    /// `none`, `latest`, `all:N` (`all` alone: at most 100).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.split_once(':') {
            None if s == "none" => Ok(Self::None),
            None if s == "latest" => Ok(Self::Latest),
            None if s == "all" => Ok(Self::All { max: 100 }),
            Some(("all", n)) => n
                .parse()
                .map(|max| Self::All { max })
                .map_err(|_| format!("`{n}` is not a number of slots")),
            _ => Err(format!("`{s}` is no catch-up policy (none, latest, all:N)")),
        }
    }
}
