//! Loading and saving a saga instance with its steps, on each backend. The caller's
//! transaction is the unit: on PostgreSQL the instance row is locked (`FOR UPDATE`) so
//! that two processes handling two replies of one saga take turns; SQLite's single
//! writer already serialises them.

use std::collections::BTreeMap;
use std::str::FromStr;

use agentsaga_core::sqlx;
use agentsaga_core::write::{Column, Datum, Kind, Table, Writes};
use agentsaga_core::{Conn, Message, Prefetch, Prefetched, Row, Tx};
use serde_json::Value;

use super::model::{Instance, StepRow};
use crate::{Error, Result, SagaId};

fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::Corrupt(what.to_string())
}

fn parse<T: FromStr>(s: &str, what: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e| corrupt(format!("{what} `{s}`: {e}")))
}

fn json(s: Option<String>) -> Result<Option<Value>> {
    s.map(|s| serde_json::from_str(&s))
        .transpose()
        .map_err(Into::into)
}

/// The columns of a step, as both backends' loads select them (ids as each backend
/// stores them, JSON as text, times as Unix milliseconds).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
const STEP_SELECT: &str = "idx, stage, name, destination, state, attempts, command_id, timer_id,
    input, output, error, compensation_destination, compensation_payload,
    compensation_state, compensation_attempts, compensation_message_id, compensation_error,
    deadline, dispatched_at, replied_at, compensated_at";

/// `saga_instances` as a save writes it, declared once for both backends (each
/// renders its statements: see [`agentsaga_core::write`]). A save updates what can
/// change; `finished_at` keeps its first value.
static INSTANCES: Table = Table::new(
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
    ],
    1,
);

/// `saga_steps` as a save writes it: a step's identity and definition stay; a
/// compensation built from the step's reply gets its payload when it is dispatched.
static STEPS: Table = Table::new(
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
    ],
    2,
);

/// An instance's row of [`INSTANCES`], written at `now` (Unix milliseconds: SQLite's
/// times; PostgreSQL takes its own clock's).
fn instance_values(inst: &Instance, now: i64) -> Vec<Datum> {
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
    ]
}

/// A step's row of [`STEPS`].
fn step_values(saga: SagaId, s: &StepRow) -> Vec<Datum> {
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
    ]
}

/// The writes that save `inst` and its `changed` steps.
fn save_writes(inst: &Instance, changed: &[&StepRow], now: i64) -> Writes {
    let mut writes = Writes::new();
    writes.upsert(&INSTANCES, instance_values(inst, now));
    for s in changed {
        writes.upsert(&STEPS, step_values(inst.id, s));
    }
    writes
}

/// Decodes a step row of either backend (selected as [`STEP_SELECT`] lists).
fn step_row(r: &Row) -> Result<StepRow> {
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
    })
}

/// Decodes an instance row of either backend (`saga_name, version, saga_state, data,
/// saga_error, saga_stage, saga_parent`), its steps not yet attached.
fn instance_row(id: SagaId, r: &Row) -> Result<Instance> {
    Ok(Instance {
        id,
        name: r.text("saga_name")?,
        version: r.int("version")? as i32,
        state: parse(&r.text("saga_state")?, "saga state")?,
        data: serde_json::from_str(&r.text("data")?)?,
        error: r.opt_text("saga_error")?,
        stage: r.int("saga_stage")? as usize,
        steps: BTreeMap::new(),
        finished: false,
        parent: r
            .opt_text("saga_parent")?
            .map(|p| serde_json::from_str(&p))
            .transpose()?,
    })
}

pub(crate) async fn load(conn: Conn<'_>, id: SagaId) -> Result<Option<Instance>> {
    agentsaga_core::match_conn!(conn, sqlite(c) => load_sqlite(c, id).await, postgres(c) => load_postgres(c, id).await)
}

/// The steps of `inst` that changed since `before` (all if `None`).
fn changed_steps<'a>(inst: &'a Instance, before: Option<&Instance>) -> Vec<&'a StepRow> {
    inst.steps
        .values()
        .filter(|s| before.and_then(|b| b.steps.get(&s.idx)) != Some(*s))
        .collect()
}

/// Saves the instance and the steps that changed since `before` (all if `None`), now.
pub(crate) async fn save(
    tx: &mut Tx,
    inst: &Instance,
    before: Option<&Instance>,
    now_ms: i64,
) -> Result<()> {
    if before == Some(inst) {
        return Ok(());
    }
    tx.write(save_writes(inst, &changed_steps(inst, before), now_ms))
        .await?;
    Ok(())
}

/// The load of saga `id` as a read that opens a hop (see [`Prefetch`]): on SQLite one
/// statement in the hop's opening round trip, on PostgreSQL's set lane
/// [`LOAD_SET_POSTGRES`] for all the sagas of the batch.
pub(crate) fn prefetch(id: SagaId) -> Option<Prefetch> {
    #[cfg(feature = "sqlite")]
    let read = Prefetch::new(load_sqlite_sql("?")).bind(id.to_string());
    #[cfg(not(feature = "sqlite"))]
    let read = Prefetch::new("");
    #[cfg(feature = "postgres")]
    let read = read.with_set(*id.as_uuid(), &LOAD_SET_POSTGRES);
    Some(read)
}

/// The saga `id` from what [`prefetch`] read when the hop opened (`Some(None)`: no
/// such saga); `None` when there is nothing to read it from: load it. One statement
/// read is SQLite's joined load, two are the set lane's instance and steps.
pub(crate) fn prefetched(id: SagaId, read: &Prefetched) -> Result<Option<Option<Instance>>> {
    match read.rows() {
        [joined] => from_joined_rows(id, joined).map(Some),
        [instances, steps] => {
            let Some(first) = instances.first() else {
                return Ok(Some(None));
            };
            let mut inst = instance_row(id, first)?;
            for r in steps {
                let step = step_row(r)?;
                inst.steps.insert(step.idx, step);
            }
            Ok(Some(Some(inst)))
        }
        _ => Ok(None),
    }
}

/// The saga `id` from the rows of its joined load (one row per step, or one row with
/// a NULL step; none: no such saga).
fn from_joined_rows(id: SagaId, rows: &[Row]) -> Result<Option<Instance>> {
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let mut inst = instance_row(id, first)?;
    for r in rows {
        if r.opt_int("idx")?.is_none() {
            continue; // no steps yet
        }
        let step = step_row(r)?;
        inst.steps.insert(step.idx, step);
    }
    Ok(Some(inst))
}

/// Saves the instance and its changed steps (as [`save`]), then enqueues `messages` in
/// `tx`, as the hop's last write ([`Tx::write_last`]): the store's driver writes them
/// in one round trip, or later with the round trip that ends the hop, or with the
/// statements of a batch of hops, as the hop allows.
pub(crate) async fn save_and_enqueue(
    tx: &mut Tx,
    inst: &Instance,
    before: Option<&Instance>,
    now_ms: i64,
    messages: &[Message],
) -> Result<()> {
    let mut writes = if before == Some(inst) {
        Writes::new()
    } else {
        save_writes(inst, &changed_steps(inst, before), now_ms)
    };
    writes.enqueue(messages);
    tx.write_last(writes).await?;
    Ok(())
}

/// Inserts new instances with their steps, then enqueues `messages`, in `tx`: a few
/// statements for the lot (the driver chunks them), on SQLite in one round trip with
/// the messages. `waits` are the `saga_signals` rows to write between the two, per
/// saga.
pub(crate) async fn insert_new(
    tx: &mut Tx,
    insts: &[Instance],
    waits: &[(SagaId, Vec<super::DeclaredWait>)],
    now_ms: i64,
    messages: &[Message],
) -> Result<()> {
    let mut writes = Writes::new();
    for inst in insts {
        writes.insert(&INSTANCES, instance_values(inst, now_ms));
    }
    for inst in insts {
        for s in inst.steps.values() {
            writes.insert(&STEPS, step_values(inst.id, s));
        }
    }
    if waits.is_empty() {
        writes.enqueue(messages);
        tx.write_last(writes).await?;
        return Ok(());
    }
    tx.write(writes).await?;
    for (id, declared) in waits {
        super::signals::register(tx.conn(), *id, declared).await?;
    }
    if !messages.is_empty() {
        tx.enqueue_batch(messages).await?;
    }
    Ok(())
}

agentsaga_core::if_sqlite! {
use agentsaga_core::sqlx::SqliteConnection;

/// The load of a saga on SQLite, its id the parameter `param`: one statement, the
/// instance joined with its steps (one row per step, or one row with a NULL step). Safe
/// on SQLite, where the caller's transaction began with `BEGIN IMMEDIATE`: no other
/// writer can change the saga while it reads.
fn load_sqlite_sql(param: &str) -> String {
    format!(
        "SELECT i.name AS saga_name, i.version, i.state AS saga_state, i.data,
            i.error AS saga_error, i.stage AS saga_stage, i.parent AS saga_parent, s.*
         FROM saga_instances i
         LEFT JOIN (SELECT saga_id, {STEP_SELECT} FROM saga_steps) s ON s.saga_id = i.id
         WHERE i.id = {param} ORDER BY s.idx"
    )
}

async fn load_sqlite(c: &mut SqliteConnection, id: SagaId) -> Result<Option<Instance>> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(load_sqlite_sql("?1")))
        .bind(id.to_string())
        .fetch_all(&mut *c)
        .await?;
    let rows = rows
        .iter()
        .map(Row::from_sqlite)
        .collect::<agentsaga_core::Result<Vec<_>>>()?;
    from_joined_rows(id, &rows)
}
}

agentsaga_core::if_postgres! {
/// The set lane's load of a batch's sagas (see [`prefetch`]): the instances locked in
/// id order (so that two batches never deadlock), then their steps, read after the
/// locks are held (as [`load_postgres`] does, a fresh snapshot per statement).
static LOAD_SET_POSTGRES: [&str; 2] = [
    "SELECT id AS prefetch_key, name AS saga_name, version, state AS saga_state,
        data::text AS data, error AS saga_error, stage AS saga_stage,
        parent::text AS saga_parent
     FROM saga_instances WHERE id = ANY($1) ORDER BY id FOR UPDATE",
    // One index lookup per saga, whatever the statistics say (a fresh table's made
    // the planner scan the whole table for `saga_id = ANY($1)`).
    "SELECT k.id AS prefetch_key, s.idx, s.stage, s.name, s.destination, s.state,
        s.attempts, s.command_id, s.timer_id, s.input::text AS input,
        s.output::text AS output, s.error, s.compensation_destination,
        s.compensation_payload::text AS compensation_payload, s.compensation_state,
        s.compensation_attempts, s.compensation_message_id, s.compensation_error,
        (extract(epoch FROM s.deadline) * 1000)::bigint AS deadline,
        (extract(epoch FROM s.dispatched_at) * 1000)::bigint AS dispatched_at,
        (extract(epoch FROM s.replied_at) * 1000)::bigint AS replied_at,
        (extract(epoch FROM s.compensated_at) * 1000)::bigint AS compensated_at
     FROM unnest($1::uuid[]) AS k(id)
     CROSS JOIN LATERAL (SELECT * FROM saga_steps WHERE saga_id = k.id) AS s",
];

use agentsaga_core::sqlx::PgConnection;

// Two statements, on purpose: the first locks the instance (waiting for a transaction
// that holds it), the second reads the steps with a snapshot taken after that wait. One
// statement joining both would read the steps as of its start, so a reply handled while
// another reply of the same saga was being committed would miss that one's step update.
async fn load_postgres(c: &mut PgConnection, id: SagaId) -> Result<Option<Instance>> {
    let Some(row) = sqlx::query(
        "SELECT name AS saga_name, version, state AS saga_state, data::text AS data,
            error AS saga_error, stage AS saga_stage, parent::text AS saga_parent
         FROM saga_instances WHERE id = $1 FOR UPDATE",
    )
    .bind(id.as_uuid())
    .fetch_optional(&mut *c)
    .await?
    else {
        return Ok(None);
    };
    let mut inst = instance_row(id, &Row::from_postgres(&row)?)?;
    let rows = sqlx::query(
        "SELECT idx, stage, name, destination, state, attempts, command_id, timer_id,
            input::text AS input, output::text AS output, error, compensation_destination,
            compensation_payload::text AS compensation_payload, compensation_state,
            compensation_attempts, compensation_message_id, compensation_error,
            (extract(epoch FROM deadline) * 1000)::bigint AS deadline,
            (extract(epoch FROM dispatched_at) * 1000)::bigint AS dispatched_at,
            (extract(epoch FROM replied_at) * 1000)::bigint AS replied_at,
            (extract(epoch FROM compensated_at) * 1000)::bigint AS compensated_at
         FROM saga_steps WHERE saga_id = $1 ORDER BY idx",
    )
    .bind(id.as_uuid())
    .fetch_all(&mut *c)
    .await?;
    for r in &rows {
        let step = step_row(&Row::from_postgres(r)?)?;
        inst.steps.insert(step.idx, step);
    }
    Ok(Some(inst))
}
}
