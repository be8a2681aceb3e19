//! Loading and saving a saga instance with its steps, on each backend. The caller's
//! transaction is the unit: on PostgreSQL the instance row is locked (`FOR UPDATE`) so
//! that two processes handling two replies of one saga take turns; SQLite's single
//! writer already serialises them.

mod tables;

use agentsaga_core::sqlx;
use agentsaga_core::write::Writes;
use agentsaga_core::{Conn, Message, Prefetch, Prefetched, Row, Tx};

use super::model::{Instance, StepRow};
use crate::{Result, SagaId};
use tables::*;

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
            i.error AS saga_error, i.stage AS saga_stage, i.parent AS saga_parent,
            i.usage AS saga_usage, i.budget AS saga_budget, s.*
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
        parent::text AS saga_parent, usage::text AS saga_usage, budget::text AS saga_budget
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
        (extract(epoch FROM s.compensated_at) * 1000)::bigint AS compensated_at,
        s.usage::text AS usage
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
            error AS saga_error, stage AS saga_stage, parent::text AS saga_parent,
            usage::text AS saga_usage, budget::text AS saga_budget
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
            (extract(epoch FROM compensated_at) * 1000)::bigint AS compensated_at,
            usage::text AS usage
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
