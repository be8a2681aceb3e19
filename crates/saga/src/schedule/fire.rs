//! Firing due schedules: [`Engine::fire_schedules`].
//!
//! One transaction per schedule: its row locked (PostgreSQL; SQLite's single writer
//! serialises), now read by the database's clock, the slots to fire chosen by its
//! catch-up and overlap policies, each slot's saga started under the start key
//! `schedule:<name>:<slot ms>` (so a slot never starts two sagas, whichever process
//! fires it and however often), and the row moved to its next slot, together. A crash
//! before the commit leaves the row as it was: the next firing fires the same slots.

use std::time::Duration;

use agentsaga_core::{Sql, Store, Tx};
use serde::Serialize;
use tracing::Instrument;

use super::table::{clock, exists, ms, read_unless_held};
use super::{Calendar, CatchUp, Overlap, Schedule, ScheduleView, fill};
use crate::{Accepted, Engine, Error, Result, SagaDefinition, SagaId};

/// At most this many slots found in time fire in one firing (a schedule every second
/// found a quarter of an hour late fires its last 1,000).
const MAX_IN_TIME: usize = 1_000;

/// At most this many due schedules are fired per call.
const BATCH: i64 = 200;

/// One slot that started a saga.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fired {
    /// The schedule.
    pub schedule: String,
    /// Its slot, Unix ms.
    pub slot_ms: i64,
    /// The saga it started (a slot whose key started a saga before starts nothing
    /// and is not reported).
    pub saga_id: SagaId,
    /// Whether the start waits behind the saga name's admission bound.
    pub waiting: bool,
}

/// What one [`Engine::fire_schedules`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Firings {
    /// The slots that started a saga.
    pub fired: Vec<Fired>,
    /// Slots skipped (overlap, catch-up, a start that failed).
    pub skipped: u64,
    /// The schedules whose firing could not start its saga, with why.
    pub failed: Vec<(String, String)>,
    /// How long until the next schedule of this engine's sagas is due, if any is
    /// (no sooner than 200 ms while a due one is held elsewhere).
    pub next_in: Option<Duration>,
    /// Due schedules passed over because another transaction held their rows.
    pub held: u64,
}

/// What one schedule's firing came to, before its commit.
enum Turn {
    /// Another transaction holds its row: left to it.
    Held,
    /// Nothing to write (paused, gone, or a queued slot whose saga still runs).
    Unchanged,
    /// Written: the slots that started a saga, and how many were skipped.
    Fired { fired: Vec<Fired>, skipped: i64 },
}

/// How soon a firing looks again at a due schedule another process holds.
pub(crate) const HELD_RETRY: Duration = Duration::from_millis(200);

impl Engine {
    /// Fires the due schedules of the sagas this engine has (others are left to the
    /// processes that have them): every slot whose time has come, as its policies say.
    /// The runtime calls it on its own; call it yourself to drive schedules without
    /// one.
    ///
    /// # Errors
    /// Store errors. A schedule whose saga cannot start (its input refused, say) is
    /// no error: its slot is skipped and the reason kept in its `last_error`.
    pub async fn fire_schedules(&self, store: &Store) -> Result<Firings> {
        let mut out = Firings::default();
        let names: std::collections::BTreeSet<&str> =
            self.definitions().map(SagaDefinition::name).collect();
        if names.is_empty() {
            return Ok(out);
        }
        let ours = format!("saga_name IN ({})", vec!["?"; names.len()].join(", "));
        let mut due = Sql::new(format!(
            "SELECT name, saga_name FROM saga_schedules WHERE paused = FALSE AND {ours} \
             AND ((next_due_ms IS NOT NULL AND next_due_ms <= {{clock_ms}}) \
             OR queued_slot_ms IS NOT NULL) ORDER BY next_due_ms IS NULL, next_due_ms LIMIT ?"
        ));
        for name in &names {
            due = due.bind(*name);
        }
        let due = due.bind(BATCH).fetch_all(store.reader()).await?;
        let mut held = Vec::new();
        for r in due {
            let saga = r.text("saga_name")?;
            let name = r.text("name")?;
            // Each schedule on its own: one that fails never stops the others.
            let why = match self.fire_one(store, &name, None, &mut out).await {
                Ok(true) => continue,
                Ok(false) => {
                    held.push(name);
                    continue;
                }
                // The database away: every schedule waits for it, this one included.
                Err(Error::Store(e)) if e.is_transient() => return Err(Error::Store(e)),
                Err(e) => format!("saga `{saga}` could not start: {e}"),
            };
            tracing::warn!(schedule = %name, error = %why, "a schedule could not fire");
            if let Err(e) = self.fire_one(store, &name, Some(&why), &mut out).await {
                // Not even its slots can be skipped (a row this binary cannot read):
                // the reason kept, tried again in a minute.
                let why = format!("{why}; its row: {e}");
                set_aside(store, &name, &why).await?;
            }
            out.failed.push((name, why));
        }
        // The next one due, of those not held elsewhere; a held one is looked at again
        // after `HELD_RETRY` (not at once: it is in another's hands).
        let mut next = Sql::new(format!(
            "SELECT next_due_ms - {{clock_ms}} AS wait FROM saga_schedules \
             WHERE paused = FALSE AND {ours} AND next_due_ms IS NOT NULL{} \
             ORDER BY next_due_ms LIMIT 1",
            if held.is_empty() {
                String::new()
            } else {
                format!(" AND name NOT IN ({})", vec!["?"; held.len()].join(", "))
            }
        ));
        for name in names.iter().copied().chain(held.iter().map(String::as_str)) {
            next = next.bind(name);
        }
        out.held = u64::try_from(held.len()).unwrap_or(u64::MAX);
        let wait = match next.fetch_optional(store.reader()).await? {
            Some(r) => Some(Duration::from_secs_f64(r.real("wait")?.max(0.0) / 1000.0)),
            None => None,
        };
        out.next_in = match (wait, held.is_empty()) {
            (wait, true) => wait,
            (Some(wait), false) => Some(wait.min(HELD_RETRY)),
            (None, false) => Some(HELD_RETRY),
        };
        Ok(out)
    }

    /// Checks `s` as [`Schedule::check`] does, and against this engine: its saga is
    /// registered, and its input (filled with a slot's time) decodes as the saga's
    /// input and makes first messages the store takes. What `Runtime::schedules()`
    /// checks before it stores a schedule.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] saying what is wrong.
    pub fn check_schedule(&self, store: &Store, s: &Schedule) -> Result<()> {
        let calendar = s.calendar()?;
        let bad = |reason: String| Error::InvalidSchedule {
            name: s.name.chars().take(64).collect(),
            reason,
        };
        let version = self
            .version_of(&s.saga)
            .map_err(|_| bad(format!("no saga named `{}` is registered here", s.saga)))?;
        let slot = calendar
            .after(store.clock().now_ms())
            .ok_or_else(|| bad("its expression names no time to come".into()))?;
        let data = fill(&s.input, slot).map_err(bad)?;
        let data = self
            .prepare(&s.saga, version, data)
            .map_err(|e| bad(format!("its input: {e}")))?;
        self.check_start(store, SagaId::new(), &s.saga, version, &data)
            .map_err(|e| bad(format!("its input: {e}")))
    }

    /// Fires schedule `name` in a transaction of its own. With `failed`, starts
    /// nothing: skips the slots it would have fired and keeps the reason. `false` if
    /// another transaction holds its row (it is left to that one).
    async fn fire_one(
        &self,
        store: &Store,
        name: &str,
        failed: Option<&str>,
        out: &mut Firings,
    ) -> Result<bool> {
        let mut tx = store.begin().await?;
        match self.fire_in(&mut tx, name, failed).await {
            Ok(Turn::Fired { fired, skipped }) => {
                tx.commit().await?;
                // Only what committed: a start refused midway rolled back the ones
                // before it.
                out.fired.extend(fired);
                out.skipped += u64::try_from(skipped).unwrap_or(0);
                Ok(true)
            }
            Ok(turn) => {
                tx.rollback().await?;
                Ok(!matches!(turn, Turn::Held))
            }
            // Rolled back now, its row lock with it: the retry that keeps the reason
            // (`failed`) must not find the row held by this very attempt.
            Err(e) => {
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }

    /// [`fire_one`](Self::fire_one)'s work in `tx`, not committed.
    async fn fire_in(&self, tx: &mut Tx, name: &str, failed: Option<&str>) -> Result<Turn> {
        // Held by another process (firing it, or frozen while it did): left to it, so
        // that one frozen holder stops no other schedule. (Or deleted meanwhile.)
        let Some(view) = read_unless_held(tx, name).await? else {
            return Ok(if exists(tx, name).await? {
                Turn::Held
            } else {
                Turn::Unchanged
            });
        };
        if view.schedule.paused {
            return Ok(Turn::Unchanged);
        }
        let now = clock(tx).await?;
        let s = &view.schedule;
        let calendar = s.calendar()?;
        let mut running = match view.last_saga_id {
            Some(id) => still_runs(tx, id).await?,
            None => false,
        };
        let mut queued = view.queued_slot_ms;
        let mut to_fire = Vec::new();
        let mut skipped = 0_i64;
        if let Some(slot) = queued
            && !running
        {
            to_fire.push(slot);
            queued = None;
            running = true;
        }
        let due = view.next_due_ms.is_some_and(|d| d <= now);
        let (next_slot, next_due) = if due {
            let (slots, beyond) = due_slots(&calendar, &view, now);
            skipped += i64::try_from(beyond).unwrap_or(i64::MAX);
            for slot in slots {
                match s.overlap {
                    Overlap::Allow => to_fire.push(slot),
                    _ if !running => {
                        to_fire.push(slot);
                        running = true;
                    }
                    Overlap::Skip => skipped += 1,
                    Overlap::QueueOne => {
                        if queued.replace(slot).is_some() {
                            skipped += 1;
                        }
                    }
                }
            }
            calendar.next_due(ms(s.jitter), now)
        } else {
            (view.next_slot_ms, view.next_due_ms)
        };
        if to_fire.is_empty() && !due && queued == view.queued_slot_ms {
            return Ok(Turn::Unchanged); // a queued slot whose saga still runs
        }
        let mut last = None;
        let mut error = None;
        if let Some(why) = failed {
            skipped += i64::try_from(to_fire.len()).unwrap_or(i64::MAX);
            to_fire.clear();
            error = Some(why.to_owned());
        }
        let mut fired = Vec::with_capacity(to_fire.len());
        for &slot in &to_fire {
            let (f, new) = self.start_slot(tx, s, slot).await?;
            last = Some((slot, f.saga_id));
            // A slot that started its saga before (its key taken) starts nothing.
            if new {
                fired.push(f);
            }
        }
        Sql::new(
            "UPDATE saga_schedules SET next_slot_ms = ?, next_due_ms = ?, queued_slot_ms = ?, \
             last_slot_ms = COALESCE(?, last_slot_ms), last_saga_id = COALESCE(?, last_saga_id), \
             last_fired_ms = CASE WHEN ? THEN ? ELSE last_fired_ms END, \
             last_error = CASE WHEN ? THEN NULL ELSE COALESCE(?, last_error) END, \
             fired = fired + ?, skipped = skipped + ? WHERE name = ?",
        )
        .bind(next_slot)
        .bind(next_due)
        .bind(queued)
        .bind(last.map(|(slot, _)| slot))
        .bind(last.map(|(_, id)| *id.as_uuid()))
        .bind(last.is_some())
        .bind(now)
        .bind(last.is_some())
        .bind(error)
        .bind(i64::try_from(fired.len()).unwrap_or(i64::MAX))
        .bind(skipped)
        .bind(name)
        .execute(tx.conn())
        .await?;
        Ok(Turn::Fired { fired, skipped })
    }

    /// Starts `s`'s saga for `slot` in `tx`, in a trace of its own; whether it is new
    /// (not the saga the slot's key started before).
    async fn start_slot(&self, tx: &mut Tx, s: &Schedule, slot: i64) -> Result<(Fired, bool)> {
        let data = fill(&s.input, slot).map_err(|reason| Error::InvalidSchedule {
            name: s.name.clone(),
            reason,
        })?;
        let key = format!("schedule:{}:{slot}", s.name);
        let span = tracing::info_span!(
            parent: None,
            "schedule.fire",
            schedule = %s.name,
            saga.name = %s.saga,
            slot_ms = slot,
        );
        let accepted = self
            .accept_keyed(tx, &s.saga, Some(&key), data)
            .instrument(span)
            .await?;
        let fired = Fired {
            schedule: s.name.clone(),
            slot_ms: slot,
            saga_id: accepted.id(),
            waiting: matches!(accepted, Accepted::Waiting(_)),
        };
        Ok((fired, !matches!(accepted, Accepted::Existing(_))))
    }
}

/// The slots of `view` due at `now`, oldest first, as its catch-up policy says, and
/// how many in time are beyond the [`MAX_IN_TIME`] one firing takes.
fn due_slots(calendar: &Calendar, view: &ScheduleView, now: i64) -> (Vec<i64>, usize) {
    let s = &view.schedule;
    let Some(first) = view.next_slot_ms else {
        return (Vec::new(), 0);
    };
    let late = ms(s.late_after).saturating_add(ms(s.jitter));
    let in_time_from = first.max(now.saturating_sub(late));
    let mut slots = calendar.between(in_time_from, now, MAX_IN_TIME, true);
    // More in time than one firing takes: the older ones are skipped, and counted.
    let mut beyond = 0;
    if slots.len() == MAX_IN_TIME {
        beyond = calendar
            .between(in_time_from, slots[0] - 1, usize::MAX, false)
            .len();
    }
    let missed_to = in_time_from - 1;
    if first <= missed_to {
        let missed = match s.catch_up {
            CatchUp::None => Vec::new(),
            CatchUp::Latest if slots.is_empty() => calendar.between(first, missed_to, 1, true),
            CatchUp::Latest => Vec::new(),
            CatchUp::All { max } => {
                calendar.between(first, missed_to, usize::try_from(max).unwrap_or(1), true)
            }
        };
        slots.splice(0..0, missed);
    }
    (slots, beyond)
}

/// Does saga `id` still run (running or compensating, or waiting to start; a start
/// set aside has stopped)? One statement: one snapshot, so a start moving from
/// `saga_starts` to `saga_instances` meanwhile is seen in one or the other.
async fn still_runs(tx: &mut Tx, id: SagaId) -> Result<bool> {
    let uuid = *id.as_uuid();
    let r = Sql::new(
        "SELECT EXISTS (SELECT 1 FROM saga_instances WHERE id = ? \
         AND state IN ('running', 'compensating')) \
         OR EXISTS (SELECT 1 FROM saga_starts WHERE id = ? AND error IS NULL) AS runs",
    )
    .bind(uuid)
    .bind(uuid)
    .fetch_one(tx.conn())
    .await?;
    Ok(r.bool("runs")?)
}

/// Keeps why schedule `name` could not fire at all, and makes it due again in a minute
/// (by the database's clock), so that it neither stops the others nor is tried every
/// second.
async fn set_aside(store: &Store, name: &str, why: &str) -> Result<()> {
    let mut tx = store.begin().await?;
    let now = clock(&mut tx).await?;
    Sql::new("UPDATE saga_schedules SET last_error = ?, next_due_ms = ? WHERE name = ?")
        .bind(why)
        .bind(now.saturating_add(60_000))
        .bind(name)
        .execute(tx.conn())
        .await?;
    tx.commit().await?;
    Ok(())
}
