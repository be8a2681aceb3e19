//! The saga tables as a save writes them (declared once for both backends) and as a
//! load decodes them.

use std::collections::BTreeMap;
use std::str::FromStr;

use agentsaga_core::Row;
use agentsaga_core::read::Load;
use agentsaga_core::write::{Column, Datum, Kind, Table, Writes};
use serde_json::Value;

use super::super::model::{Instance, StepRow};
use crate::budget::Usage;
use crate::{Error, Result, SagaId};

pub(super) fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::Corrupt(what.to_string())
}

pub(super) fn parse<T: FromStr>(s: &str, what: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e| corrupt(format!("{what} `{s}`: {e}")))
}

pub(super) fn json(s: Option<String>) -> Result<Option<Value>> {
    s.map(|s| serde_json::from_str(&s))
        .transpose()
        .map_err(Into::into)
}

/// A saga with its steps, as a hop loads it (each driver renders the read: see
/// [`agentsaga_core::read`]).
pub(super) static SAGA: Load = Load::new(
    &INSTANCES,
    &[
        "name", "version", "state", "data", "error", "stage", "parent", "usage", "budget", "pause",
        "rewinds",
    ],
    &STEPS,
    &[
        "idx",
        "stage",
        "name",
        "destination",
        "state",
        "attempts",
        "command_id",
        "timer_id",
        "input",
        "output",
        "error",
        "compensation_destination",
        "compensation_payload",
        "compensation_state",
        "compensation_attempts",
        "compensation_message_id",
        "compensation_error",
        "deadline",
        "dispatched_at",
        "replied_at",
        "compensated_at",
        "usage",
        "data_before",
    ],
);

/// `saga_instances` as a save writes it, declared once for both backends (each
/// renders its statements: see [`agentsaga_core::write`]). A save updates what can
/// change; `finished_at` keeps its first value.
pub(super) static INSTANCES: Table = Table::new(
    "saga_instances",
    &[
        Column::new("id", Kind::Id),
        Column::new("name", Kind::Text).kept(),
        Column::new("version", Kind::Int).kept(),
        Column::new("state", Kind::Text),
        Column::new("data", Kind::Json),
        Column::new("error", Kind::Text),
        Column::new("stage", Kind::Int),
        Column::new("created_at", Kind::Stamp).kept(),
        Column::new("updated_at", Kind::Stamp),
        Column::new("finished_at", Kind::Stamp).first(),
        Column::new("parent_id", Kind::Id).kept(),
        Column::new("parent", Kind::Json),
        Column::new("usage", Kind::Json),
        Column::new("budget", Kind::Json),
        Column::new("trace_parent", Kind::Text).kept(),
        Column::new("pause", Kind::Json),
        Column::new("rewinds", Kind::Json),
    ],
    1,
);

/// `saga_steps` as a save writes it: a step's identity and definition stay; a
/// compensation built from the step's reply gets its payload when it is dispatched.
pub(super) static STEPS: Table = Table::new(
    "saga_steps",
    &[
        Column::new("saga_id", Kind::Id),
        Column::new("idx", Kind::Int),
        Column::new("stage", Kind::Int).kept(),
        Column::new("name", Kind::Text).kept(),
        Column::new("destination", Kind::Text).kept(),
        Column::new("state", Kind::Text),
        Column::new("attempts", Kind::Int),
        Column::new("command_id", Kind::Id),
        Column::new("timer_id", Kind::Id),
        Column::new("input", Kind::Json),
        Column::new("output", Kind::Json),
        Column::new("error", Kind::Text),
        Column::new("compensation_destination", Kind::Text).kept(),
        Column::new("compensation_payload", Kind::Json),
        Column::new("compensation_state", Kind::Text),
        Column::new("compensation_attempts", Kind::Int),
        Column::new("compensation_message_id", Kind::Id),
        Column::new("compensation_error", Kind::Text),
        Column::new("deadline", Kind::Time),
        Column::new("dispatched_at", Kind::Time),
        Column::new("replied_at", Kind::Time),
        Column::new("compensated_at", Kind::Time),
        Column::new("usage", Kind::Json),
        Column::new("data_before", Kind::Json).kept(),
    ],
    2,
);

/// An instance's row of [`INSTANCES`], written at `now` (Unix milliseconds: SQLite's
/// times; PostgreSQL takes its own clock's).
pub(super) fn instance_values(inst: &Instance, now: i64) -> Vec<Datum> {
    vec![
        Datum::Id(*inst.id.as_uuid()),
        Datum::from(inst.name.as_str()),
        Datum::from(inst.version),
        Datum::from(inst.state.as_str()),
        Datum::Text(inst.data.to_string()),
        Datum::from(inst.error.clone()),
        Datum::Int(inst.stage as i64),
        Datum::Now(now),
        Datum::Now(now),
        if inst.finished {
            Datum::Now(now)
        } else {
            Datum::Null
        },
        inst.parent
            .as_ref()
            .map_or(Datum::Null, |p| Datum::Id(*p.saga.as_uuid())),
        inst.parent.as_ref().map_or(Datum::Null, |p| {
            Datum::Text(serde_json::to_string(p).expect("a parent link serializes"))
        }),
        usage_datum(&inst.usage),
        inst.budget.as_ref().map_or(Datum::Null, |b| {
            Datum::Text(serde_json::to_string(b).expect("a budget serializes"))
        }),
        Datum::from(inst.trace.clone()),
        inst.pause.as_ref().map_or(Datum::Null, |p| {
            Datum::Text(serde_json::to_string(p).expect("a pause serializes"))
        }),
        if inst.rewinds.is_empty() {
            Datum::Null
        } else {
            Datum::Text(serde_json::to_string(&inst.rewinds).expect("rewinds serialize"))
        },
    ]
}

/// A step's row of [`STEPS`].
pub(super) fn step_values(saga: SagaId, s: &StepRow) -> Vec<Datum> {
    let json = |v: &Option<Value>| Datum::from(v.as_ref().map(Value::to_string));
    vec![
        Datum::Id(*saga.as_uuid()),
        Datum::Int(s.idx as i64),
        Datum::Int(s.stage as i64),
        Datum::from(s.name.as_str()),
        Datum::from(s.destination.as_str()),
        Datum::from(s.state.as_str()),
        Datum::from(s.attempts),
        Datum::from(s.command_id),
        Datum::from(s.timer_id),
        json(&s.input),
        json(&s.output),
        Datum::from(s.error.clone()),
        Datum::from(s.compensation_destination.clone()),
        json(&s.compensation_payload),
        Datum::from(s.compensation_state.map(|c| c.as_str())),
        Datum::from(s.compensation_attempts),
        Datum::from(s.compensation_message_id),
        Datum::from(s.compensation_error.clone()),
        Datum::from(s.deadline_ms),
        Datum::from(s.dispatched_at),
        Datum::from(s.replied_at),
        Datum::from(s.compensated_at),
        usage_datum(&s.usage),
        Datum::from(s.data_before.clone()),
    ]
}

/// A usage column: NULL while nothing was reported.
pub(super) fn usage_datum(u: &Usage) -> Datum {
    if u.is_zero() {
        Datum::Null
    } else {
        Datum::Text(serde_json::to_string(u).expect("a usage serializes"))
    }
}

/// Decodes a JSON column into `T` (its default when NULL).
pub(super) fn json_or_default<T: serde::de::DeserializeOwned + Default>(
    s: Option<String>,
) -> Result<T> {
    s.map_or_else(|| Ok(T::default()), |s| Ok(serde_json::from_str(&s)?))
}

/// The writes that save `inst` and its `changed` steps.
pub(super) fn save_writes(inst: &Instance, changed: &[&StepRow], now: i64) -> Writes {
    let mut writes = Writes::new();
    writes.upsert(&INSTANCES, instance_values(inst, now));
    for s in changed {
        writes.upsert(&STEPS, step_values(inst.id, s));
    }
    writes
}

/// Decodes a step row (as [`SAGA`] reads it).
pub(super) fn step_row(r: &Row) -> Result<StepRow> {
    Ok(StepRow {
        idx: r.int("idx")? as usize,
        stage: r.int("stage")? as usize,
        name: r.text("name")?,
        destination: r.text("destination")?,
        state: parse(&r.text("state")?, "step state")?,
        attempts: r.int("attempts")? as u32,
        command_id: r.opt_id("command_id")?,
        timer_id: r.opt_id("timer_id")?,
        input: json(r.opt_text("input")?)?,
        output: json(r.opt_text("output")?)?,
        error: r.opt_text("error")?,
        compensation_destination: r.opt_text("compensation_destination")?,
        compensation_payload: json(r.opt_text("compensation_payload")?)?,
        compensation_state: r
            .opt_text("compensation_state")?
            .map(|s| parse(&s, "compensation state"))
            .transpose()?,
        compensation_attempts: r.int("compensation_attempts")? as u32,
        compensation_message_id: r.opt_id("compensation_message_id")?,
        compensation_error: r.opt_text("compensation_error")?,
        deadline_ms: r.opt_int("deadline")?,
        dispatched_at: r.opt_int("dispatched_at")?,
        replied_at: r.opt_int("replied_at")?,
        compensated_at: r.opt_int("compensated_at")?,
        usage: json_or_default(r.opt_text("usage")?)?,
        data_before: r.opt_text("data_before")?,
    })
}

/// Decodes an instance row (as [`SAGA`] reads it), its steps not yet attached.
pub(super) fn instance_row(id: SagaId, r: &Row) -> Result<Instance> {
    Ok(Instance {
        id,
        name: r.text("name")?,
        version: r.int("version")? as i32,
        state: parse(&r.text("state")?, "saga state")?,
        data: serde_json::from_str(&r.text("data")?)?,
        error: r.opt_text("error")?,
        stage: r.int("stage")? as usize,
        steps: BTreeMap::new(),
        finished: false,
        parent: r
            .opt_text("parent")?
            .map(|p| serde_json::from_str(&p))
            .transpose()?,
        usage: json_or_default(r.opt_text("usage")?)?,
        budget: r
            .opt_text("budget")?
            .map(|b| serde_json::from_str(&b))
            .transpose()?,
        pause: r
            .opt_text("pause")?
            .map(|p| serde_json::from_str(&p))
            .transpose()?,
        rewinds: json_or_default(r.opt_text("rewinds")?)?,
        trace: None,
    })
}
