//! `agentsaga schedules ...`: sagas started on a cron calendar (`saga_schedules`). A
//! schedule's flags are parsed one by one here, then checked together
//! ([`SchedulesCommand::check`]: name, expression and time zone, bounds, input template)
//! before the database is opened.

use std::time::Duration;

use agentsaga_saga::schedule::{CatchUp, Overlap, Schedule};
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::format;

/// `agentsaga schedules ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum SchedulesCommand {
    /// Every schedule, by name: its calendar, when it is next due, what its firings did.
    List {
        /// Print one JSON document instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One schedule: every field, where it stands, its last firing.
    Show {
        /// The schedule's name.
        name: String,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Create a schedule; refused if one has its name (`put` replaces). Its first slot
    /// is the first time its expression names after now.
    Create(ScheduleArgs),
    /// Create or replace a schedule: it becomes what the flags say (a flag left out
    /// takes its default, not the old value); its counts and last firing are kept, a
    /// slot queued for it is dropped, its next slot is set from now.
    Put(ScheduleArgs),
    /// Pause a schedule: it fires nothing until resumed (a slot queued for it is
    /// dropped).
    Pause(ScheduleName),
    /// Resume a paused schedule from its first slot after now (the slots it slept
    /// through are not caught up).
    Resume(ScheduleName),
    /// Delete a schedule; the sagas it started are left alone.
    Delete {
        /// The schedule's name.
        name: String,
    },
}

/// `schedules pause | resume NAME`.
#[derive(Debug, Args)]
pub(crate) struct ScheduleName {
    /// The schedule's name.
    pub(crate) name: String,
    /// Print the schedule after the change as one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `schedules create | put NAME --saga S --cron EXPR ...`.
///
/// The CLI has no saga definitions: the saga's name and the input are not checked
/// against the saga here. Only a process that has the saga fires the schedule (one
/// naming a saga no process has stays due, firing nothing); an input the saga refuses
/// skips the slot, and the firing process records why in the schedule's `last_error`.
#[derive(Debug, Args)]
pub(crate) struct ScheduleArgs {
    /// The schedule's name, unique in the database.
    pub(crate) name: String,
    /// The saga it starts (its newest version registered in the process that fires
    /// it). Not checked here: the CLI has no saga definitions.
    #[arg(long, value_name = "SAGA")]
    pub(crate) saga: String,
    /// When: a cron expression of 5 fields (minute first) or 6 (second first), e.g.
    /// `0 7 * * MON-FRI`.
    #[arg(long, value_name = "EXPR")]
    pub(crate) cron: String,
    /// The IANA time zone the expression reads in, e.g. `Europe/Paris` [default: UTC].
    #[arg(long, value_name = "TZ")]
    pub(crate) time_zone: Option<String>,
    /// The saga's input, as JSON [default: null]; `{"$fire_time": "rfc3339"}` or
    /// `{"$fire_time": "unix_ms"}` in it becomes the slot's time. Not checked against
    /// the saga here (the CLI has no saga definitions): an input the saga refuses
    /// starts nothing, and the firing process records why in the schedule's
    /// `last_error` (`schedules show`).
    #[arg(long, value_name = "JSON", value_parser = parse_json)]
    pub(crate) input: Option<Value>,
    /// While the previous firing's saga still runs: skip the slot, queue_one (fire it
    /// when that saga ends; a later slot replaces it), allow (start anyway)
    /// [default: skip].
    #[arg(long, value_name = "POLICY", value_parser = parse_overlap)]
    pub(crate) overlap: Option<Overlap>,
    /// Slots missed while no process fired it: none, latest, all:N (the oldest first,
    /// at most the latest N, 1 to 1000) [default: none].
    #[arg(long, value_name = "POLICY", value_parser = parse_catch_up)]
    pub(crate) catch_up: Option<CatchUp>,
    /// How late a slot may be found and still fire as in time (1s to 1d; a number and
    /// a unit: ms, s, m, h, d) [default: 1m].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub(crate) late_after: Option<Duration>,
    /// Fire each slot up to this much after its time, at random, so that schedules on
    /// one time spread out (at most 1d) [default: 0s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub(crate) jitter: Option<Duration>,
    /// Store it paused: it fires nothing until `schedules resume`.
    #[arg(long)]
    pub(crate) paused: bool,
    /// Print the stored schedule as one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

impl ScheduleArgs {
    /// The schedule the flags describe (not checked), the library's defaults for the
    /// flags left out.
    pub(crate) fn schedule(&self) -> Schedule {
        let mut s = Schedule::new(&self.name, &self.saga, &self.cron).paused(self.paused);
        if let Some(tz) = &self.time_zone {
            s = s.time_zone(tz);
        }
        if let Some(input) = &self.input {
            s = s.input(input.clone());
        }
        if let Some(overlap) = self.overlap {
            s = s.overlap(overlap);
        }
        if let Some(catch_up) = self.catch_up {
            s = s.catch_up(catch_up);
        }
        if let Some(late_after) = self.late_after {
            s = s.late_after(late_after);
        }
        if let Some(jitter) = self.jitter {
            s = s.jitter(jitter);
        }
        s
    }
}

impl SchedulesCommand {
    /// Checks a schedule to be stored (`create`, `put`) as far as it can be without the
    /// saga's definition; the reason it is refused.
    pub(crate) fn check(&self) -> Result<(), String> {
        match self {
            Self::Create(a) | Self::Put(a) => a.schedule().check().map_err(|e| e.to_string()),
            _ => Ok(()),
        }
    }
}

fn parse_json(s: &str) -> Result<Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))
}

fn parse_overlap(s: &str) -> Result<Overlap, String> {
    s.parse()
}

fn parse_catch_up(s: &str) -> Result<CatchUp, String> {
    s.parse()
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    format::parse_duration(s)
}
