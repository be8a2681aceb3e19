//! Loading and saving a saga instance with its steps, on each backend. The caller's
//! transaction is the unit: on PostgreSQL the instance row is locked (`FOR UPDATE`) so
//! that two processes handling two replies of one saga take turns; SQLite's single
//! writer already serialises them.

use std::collections::BTreeMap;
use std::str::FromStr;

use agentsaga_core::sqlx;
use agentsaga_core::{Conn, Message, MessageId, Prefetch, Prefetched, Tx};
#[cfg(feature = "postgres")]
use agentsaga_core::{Integer, sqlx::Row};
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

/// The columns a save writes, in the order both backends bind them.
macro_rules! step_insert {
    () => {
        "INSERT INTO saga_steps (saga_id, idx, stage, name, destination,
    state, attempts, command_id, timer_id, input, output, error, compensation_destination,
    compensation_payload, compensation_state, compensation_attempts, compensation_message_id,
    compensation_error, deadline, dispatched_at, replied_at, compensated_at) "
    };
}
const STEP_INSERT: &str = step_insert!();

/// What a save changes in a step that exists (its identity and definition stay; a
/// compensation built from the step's reply gets its payload when it is dispatched).
macro_rules! step_upsert {
    () => {
        " ON CONFLICT (saga_id, idx) DO UPDATE SET state = excluded.state,
    attempts = excluded.attempts, command_id = excluded.command_id,
    timer_id = excluded.timer_id, input = excluded.input, output = excluded.output,
    error = excluded.error, compensation_payload = excluded.compensation_payload,
    compensation_state = excluded.compensation_state,
    compensation_attempts = excluded.compensation_attempts,
    compensation_message_id = excluded.compensation_message_id,
    compensation_error = excluded.compensation_error, deadline = excluded.deadline,
    dispatched_at = excluded.dispatched_at, replied_at = excluded.replied_at,
    compensated_at = excluded.compensated_at"
    };
}
const STEP_UPSERT: &str = step_upsert!();

/// What a save changes in an instance that exists.
macro_rules! instance_upsert {
    () => {
        " ON CONFLICT (id) DO UPDATE SET state = excluded.state,
    data = excluded.data, error = excluded.error, stage = excluded.stage,
    updated_at = excluded.updated_at,
    finished_at = COALESCE(saga_instances.finished_at, excluded.finished_at)"
    };
}
const INSTANCE_UPSERT: &str = instance_upsert!();

/// The columns of a row as the loads read them: what [`step_row`] and
/// [`instance_row`] decode, on either backend.
trait Cols {
    /// A small integer (`INTEGER` on SQLite, `int4` on PostgreSQL).
    fn int(&self, col: &str) -> Result<i64>;
    /// A nullable 64-bit integer.
    fn opt_int(&self, col: &str) -> Result<Option<i64>>;
    fn text(&self, col: &str) -> Result<String>;
    fn opt_text(&self, col: &str) -> Result<Option<String>>;
    fn opt_id(&self, col: &str) -> Result<Option<MessageId>>;
}

#[cfg(feature = "sqlite")]
impl Cols for agentsaga_core::Row {
    fn int(&self, col: &str) -> Result<i64> {
        Ok(agentsaga_core::Row::int(self, col)?)
    }
    fn opt_int(&self, col: &str) -> Result<Option<i64>> {
        Ok(agentsaga_core::Row::opt_int(self, col)?)
    }
    fn text(&self, col: &str) -> Result<String> {
        Ok(agentsaga_core::Row::text(self, col)?)
    }
    fn opt_text(&self, col: &str) -> Result<Option<String>> {
        Ok(agentsaga_core::Row::opt_text(self, col)?)
    }
    fn opt_id(&self, col: &str) -> Result<Option<MessageId>> {
        Ok(agentsaga_core::Row::opt_id(self, col)?)
    }
}

#[cfg(feature = "postgres")]
impl Cols for sqlx::postgres::PgRow {
    fn int(&self, col: &str) -> Result<i64> {
        Ok(self.try_get::<Integer, _>(col)?.0)
    }
    fn opt_int(&self, col: &str) -> Result<Option<i64>> {
        Ok(self.try_get(col)?)
    }
    fn text(&self, col: &str) -> Result<String> {
        Ok(self.try_get(col)?)
    }
    fn opt_text(&self, col: &str) -> Result<Option<String>> {
        Ok(self.try_get(col)?)
    }
    fn opt_id(&self, col: &str) -> Result<Option<MessageId>> {
        Ok(self.try_get(col)?)
    }
}

/// Decodes a step row of either backend (selected as [`STEP_SELECT`] lists).
fn step_row(r: &impl Cols) -> Result<StepRow> {
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
/// saga_error, saga_stage`), its steps not yet attached.
fn instance_row(id: SagaId, r: &impl Cols) -> Result<Instance> {
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

/// Saves the instance and the steps that changed since `before` (all if `None`).
pub(crate) async fn save(
    conn: Conn<'_>,
    inst: &Instance,
    before: Option<&Instance>,
    now_ms: i64,
) -> Result<()> {
    if before == Some(inst) {
        return Ok(());
    }
    let changed = changed_steps(inst, before);
    agentsaga_core::match_conn!(conn, sqlite(c) => save_sqlite(c, inst, &changed, now_ms).await, postgres(c) => save_postgres(c, inst, &changed, now_ms).await)
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

/// The saga `id` from what [`prefetch`] read in a hop of `backend` (`Some(None)`: no
/// such saga); `None` when there is nothing to read it from: load it.
pub(crate) fn prefetched(
    id: SagaId,
    read: &Prefetched,
    backend: &str,
) -> Result<Option<Option<Instance>>> {
    #[cfg(feature = "postgres")]
    if backend == "postgres" {
        let [instances, steps] = read.set_rows() else {
            return Ok(None);
        };
        let Some(first) = instances.first() else {
            return Ok(Some(None));
        };
        let mut inst = instance_row(id, first)?;
        for r in steps {
            let step = step_row(r)?;
            inst.steps.insert(step.idx, step);
        }
        return Ok(Some(Some(inst)));
    }
    #[cfg(feature = "sqlite")]
    if backend == "sqlite" {
        return from_sqlite_rows(id, read.rows()).map(Some);
    }
    let _ = (id, read, backend);
    Ok(None)
}

/// Saves the instance and its changed steps (as [`save`]), then enqueues `messages` in
/// `tx`: on SQLite in one round trip ([`Tx::enqueue_batch_after`]; after
/// [`Tx::defer_next_write`], the one that ends the hop).
pub(crate) async fn save_and_enqueue(
    tx: &mut Tx,
    inst: &Instance,
    before: Option<&Instance>,
    now_ms: i64,
    messages: &[Message],
) -> Result<()> {
    #[cfg(feature = "postgres")]
    if tx.take_set_deferral() {
        // PostgreSQL's set lane: written with the batch's other hops' rows.
        if before != Some(inst) {
            defer_postgres(tx, inst, &changed_steps(inst, before))?;
        }
        if !messages.is_empty() {
            tx.defer_enqueue(messages)?;
        }
        return Ok(());
    }
    #[cfg(feature = "sqlite")]
    if before != Some(inst) && tx.backend() == "sqlite" {
        let changed = changed_steps(inst, before);
        let query = save_sqlite_query(inst, &changed, now_ms);
        tx.enqueue_batch_after(query, messages).await?;
        return Ok(());
    }
    save(tx.conn(), inst, before, now_ms).await?;
    if !messages.is_empty() {
        tx.enqueue_batch(messages).await?;
    }
    Ok(())
}

/// Largest number of bound values in one of [`insert_new`]'s statements, under both
/// backends' limits (SQLite 32,766, PostgreSQL 65,535).
const MAX_BINDS: usize = 20_000;

/// Binds an instance and its steps take in [`insert_new`]'s statements.
fn binds_of(inst: &Instance) -> usize {
    10 + 22 * inst.steps.len()
}

/// Inserts new instances with their steps, then enqueues `messages`, in `tx`: a few
/// statements for the lot, on SQLite the last of them in one round trip with the
/// messages ([`Tx::enqueue_batch_after`]). `waits` are the `saga_signals` rows to write
/// between the two, per saga.
#[allow(irrefutable_let_patterns)] // a SQLite-only build has no other connection
pub(crate) async fn insert_new(
    tx: &mut Tx,
    insts: &[Instance],
    waits: &[(SagaId, Vec<super::DeclaredWait>)],
    now_ms: i64,
    messages: &[Message],
) -> Result<()> {
    let mut chunks: Vec<Vec<&Instance>> = vec![Vec::new()];
    let mut binds = 0;
    for inst in insts {
        let n = binds_of(inst);
        if binds + n > MAX_BINDS && chunks.last().is_some_and(|c| !c.is_empty()) {
            chunks.push(Vec::new());
            binds = 0;
        }
        binds += n;
        if let Some(last) = chunks.last_mut() {
            last.push(inst);
        }
    }
    chunks.retain(|c| !c.is_empty());
    #[cfg(not(feature = "sqlite"))]
    let _ = now_ms; // PostgreSQL takes its times from now()
    #[cfg(feature = "sqlite")]
    if waits.is_empty()
        && tx.backend() == "sqlite"
        && let Some((last, firsts)) = chunks.split_last()
    {
        for chunk in firsts {
            let q = insert_sqlite_query(chunk, now_ms);
            if let Conn::Sqlite(c) = tx.conn() {
                q.to_sqlx().build().execute(&mut *c).await?;
            }
        }
        tx.enqueue_batch_after(insert_sqlite_query(last, now_ms), messages)
            .await?;
        return Ok(());
    }
    for chunk in &chunks {
        agentsaga_core::match_conn!(tx.conn(), sqlite(c) => {
            insert_sqlite_query(chunk, now_ms).to_sqlx().build().execute(&mut *c).await?;
        }, postgres(c) => insert_postgres(c, chunk).await?);
    }
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
            i.error AS saga_error, i.stage AS saga_stage, s.*
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
        .map(agentsaga_core::Row::from_sqlx)
        .collect::<agentsaga_core::Result<Vec<_>>>()?;
    from_sqlite_rows(id, &rows)
}

/// The saga `id` from the rows of its load (none: no such saga).
fn from_sqlite_rows(id: SagaId, rows: &[agentsaga_core::Row]) -> Result<Option<Instance>> {
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

async fn save_sqlite(
    c: &mut SqliteConnection,
    inst: &Instance,
    changed: &[&StepRow],
    now: i64,
) -> Result<()> {
    save_sqlite_query(inst, changed, now).to_sqlx().build().execute(&mut *c).await?;
    Ok(())
}

/// The statements that save `inst` and its `changed` steps on SQLite, as one query.
fn save_sqlite_query(
    inst: &Instance,
    changed: &[&StepRow],
    now: i64,
) -> agentsaga_core::Statements {
    // Two statements in one round trip (one hand-off to the connection's thread):
    // SQLite has no data-modifying CTE to carry the instance's upsert into the steps'
    // (PostgreSQL saves in one statement). The binds are positional, numbered across
    // both statements. Several statements in one query is a SQLite-only feature of
    // sqlx (deprecated upstream, sqlx#3108, supported by the 0.9 the lockfile pins);
    // every saga test saves through here.
    let mut q = agentsaga_core::Statements::new(
        "INSERT INTO saga_instances (id, name, version, state, data, error, stage, created_at, updated_at, finished_at) VALUES (",
    );
    q.separated(", ")
        .push_bind(inst.id.to_string())
        .push_bind(&inst.name)
        .push_bind(inst.version)
        .push_bind(inst.state.as_str())
        .push_bind(inst.data.to_string())
        .push_bind(inst.error.as_deref())
        .push_bind(inst.stage as i64)
        .push_bind(now)
        .push_bind(now)
        .push("CASE WHEN ")
        .push_bind_unseparated(inst.finished)
        .push_unseparated(" THEN ")
        .push_bind_unseparated(now)
        .push_unseparated(" END");
    q.push(")");
    q.push(INSTANCE_UPSERT);
    if changed.is_empty() {
        return q;
    }
    q.end_statement();
    q.push(STEP_INSERT);
    q.push_values(changed, |mut b, s| sqlite_step_values(&mut b, inst.id, s));
    q.push(STEP_UPSERT);
    q
}

/// Binds a step's row as [`STEP_INSERT`] lists its columns.
fn sqlite_step_values(
    b: &mut agentsaga_core::Separated<'_>,
    saga: SagaId,
    s: &StepRow,
) {
    b.push_bind(saga.to_string())
        .push_bind(s.idx as i64)
        .push_bind(s.stage as i64)
        .push_bind(&s.name)
        .push_bind(&s.destination)
        .push_bind(s.state.as_str())
        .push_bind(i64::from(s.attempts))
        .push_bind(s.command_id)
        .push_bind(s.timer_id)
        .push_bind(s.input.as_ref().map(Value::to_string))
        .push_bind(s.output.as_ref().map(Value::to_string))
        .push_bind(s.error.as_deref())
        .push_bind(s.compensation_destination.as_deref())
        .push_bind(s.compensation_payload.as_ref().map(Value::to_string))
        .push_bind(s.compensation_state.map(|c| c.as_str()))
        .push_bind(i64::from(s.compensation_attempts))
        .push_bind(s.compensation_message_id)
        .push_bind(s.compensation_error.as_deref())
        .push_bind(s.deadline_ms)
        .push_bind(s.dispatched_at)
        .push_bind(s.replied_at)
        .push_bind(s.compensated_at);
}

/// The statements that insert new instances and their steps on SQLite, as one query
/// (one or two statements: the count is returned too).
fn insert_sqlite_query(insts: &[&Instance], now: i64) -> agentsaga_core::Statements {
    let mut q = agentsaga_core::Statements::new(
        "INSERT INTO saga_instances (id, name, version, state, data, error, stage, created_at, updated_at, finished_at) ",
    );
    q.push_values(insts, |mut b, inst| {
        b.push_bind(inst.id.to_string())
            .push_bind(&inst.name)
            .push_bind(inst.version)
            .push_bind(inst.state.as_str())
            .push_bind(inst.data.to_string())
            .push_bind(inst.error.as_deref())
            .push_bind(inst.stage as i64)
            .push_bind(now)
            .push_bind(now)
            .push_bind(inst.finished.then_some(now));
    });
    let steps: Vec<(SagaId, &StepRow)> = insts
        .iter()
        .flat_map(|i| i.steps.values().map(move |s| (i.id, s)))
        .collect();
    if steps.is_empty() {
        return q;
    }
    q.end_statement();
    q.push(STEP_INSERT);
    q.push_values(&steps, |mut b, (saga, s)| sqlite_step_values(&mut b, *saga, s));
    q
}
}

agentsaga_core::if_postgres! {
use agentsaga_core::{SetStatement, SetValue};

/// The set lane's load of a batch's sagas (see [`prefetch`]): the instances locked in
/// id order (so that two batches never deadlock), then their steps, read after the
/// locks are held (as [`load_postgres`] does, a fresh snapshot per statement).
static LOAD_SET_POSTGRES: [&str; 2] = [
    "SELECT id AS prefetch_key, name AS saga_name, version, state AS saga_state,
        data::text AS data, error AS saga_error, stage AS saga_stage
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

/// [`save_postgres`]'s instance upsert for a batch of sagas (the set lane).
static SAVE_INSTANCES_SET: SetStatement = SetStatement {
    sql: concat!(
        "INSERT INTO saga_instances (id, name, version, state, data, error, stage, finished_at)
         SELECT u.id, u.name, u.version, u.state, u.data::jsonb, u.error, u.stage,
                CASE WHEN u.finished THEN now() END
         FROM unnest($1::uuid[], $2::text[], $3::int4[], $4::text[], $5::text[], $6::text[],
                     $7::int4[], $8::bool[])
              AS u(id, name, version, state, data, error, stage, finished)",
        instance_upsert!()
    ),
    key_columns: 1,
};

/// [`save_postgres`]'s steps upsert for a batch of sagas (the set lane).
static SAVE_STEPS_SET: SetStatement = SetStatement {
    sql: concat!(
        step_insert!(),
        "SELECT u.saga_id, u.idx, u.stage, u.name, u.destination, u.state, u.attempts,
                u.command_id, u.timer_id, u.input::jsonb, u.output::jsonb, u.error, u.cd,
                u.cp::jsonb, u.cs, u.ca, u.cm, u.ce, to_timestamp(u.deadline / 1000.0),
                to_timestamp(u.dispatched_at / 1000.0), to_timestamp(u.replied_at / 1000.0),
                to_timestamp(u.compensated_at / 1000.0)
         FROM unnest($1::uuid[], $2::int4[], $3::int4[], $4::text[], $5::text[], $6::text[],
                     $7::int4[], $8::uuid[], $9::uuid[], $10::text[], $11::text[], $12::text[],
                     $13::text[], $14::text[], $15::text[], $16::int4[], $17::uuid[],
                     $18::text[], $19::int8[], $20::int8[], $21::int8[], $22::int8[])
              AS u(saga_id, idx, stage, name, destination, state, attempts, command_id,
                   timer_id, input, output, error, cd, cp, cs, ca, cm, ce, deadline,
                   dispatched_at, replied_at, compensated_at)",
        step_upsert!()
    ),
    key_columns: 2,
};

/// [`save_postgres`] as rows kept by a hop of the set lane.
fn defer_postgres(tx: &mut Tx, inst: &Instance, changed: &[&StepRow]) -> Result<()> {
    let text = |v: &Option<Value>| SetValue::Text(v.as_ref().map(Value::to_string));
    let id = |m: Option<MessageId>| SetValue::Uuid(m.map(|m| *m.as_uuid()));
    tx.defer_rows(
        &SAVE_INSTANCES_SET,
        vec![
            SetValue::Uuid(Some(*inst.id.as_uuid())),
            SetValue::Text(Some(inst.name.clone())),
            SetValue::Int(Some(inst.version)),
            SetValue::Text(Some(inst.state.as_str().to_owned())),
            SetValue::Text(Some(inst.data.to_string())),
            SetValue::Text(inst.error.clone()),
            SetValue::Int(Some(inst.stage as i32)),
            SetValue::Bool(Some(inst.finished)),
        ],
    )?;
    for s in changed {
        tx.defer_rows(
            &SAVE_STEPS_SET,
            vec![
                SetValue::Uuid(Some(*inst.id.as_uuid())),
                SetValue::Int(Some(s.idx as i32)),
                SetValue::Int(Some(s.stage as i32)),
                SetValue::Text(Some(s.name.clone())),
                SetValue::Text(Some(s.destination.clone())),
                SetValue::Text(Some(s.state.as_str().to_owned())),
                SetValue::Int(Some(s.attempts as i32)),
                id(s.command_id),
                id(s.timer_id),
                text(&s.input),
                text(&s.output),
                SetValue::Text(s.error.clone()),
                SetValue::Text(s.compensation_destination.clone()),
                text(&s.compensation_payload),
                SetValue::Text(s.compensation_state.map(|c| c.as_str().to_owned())),
                SetValue::Int(Some(s.compensation_attempts as i32)),
                id(s.compensation_message_id),
                SetValue::Text(s.compensation_error.clone()),
                SetValue::BigInt(s.deadline_ms),
                SetValue::BigInt(s.dispatched_at),
                SetValue::BigInt(s.replied_at),
                SetValue::BigInt(s.compensated_at),
            ],
        )?;
    }
    Ok(())
}

use agentsaga_core::sqlx::PgConnection;

// Two statements, on purpose: the first locks the instance (waiting for a transaction
// that holds it), the second reads the steps with a snapshot taken after that wait. One
// statement joining both would read the steps as of its start, so a reply handled while
// another reply of the same saga was being committed would miss that one's step update.
async fn load_postgres(c: &mut PgConnection, id: SagaId) -> Result<Option<Instance>> {
    let Some(row) = sqlx::query(
        "SELECT name AS saga_name, version, state AS saga_state, data::text AS data,
            error AS saga_error, stage AS saga_stage
         FROM saga_instances WHERE id = $1 FOR UPDATE",
    )
    .bind(id.as_uuid())
    .fetch_optional(&mut *c)
    .await?
    else {
        return Ok(None);
    };
    let mut inst = instance_row(id, &row)?;
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
        let step = step_row(r)?;
        inst.steps.insert(step.idx, step);
    }
    Ok(Some(inst))
}

async fn save_postgres(
    c: &mut PgConnection,
    inst: &Instance,
    changed: &[&StepRow],
    _now: i64,
) -> Result<()> {
    // One statement: the instance upsert in a CTE, the changed steps as one multi-row
    // upsert (their foreign key is checked at the end of the statement, when the
    // instance row is there).
    let mut q = sqlx::QueryBuilder::<sqlx::Postgres>::new(if changed.is_empty() {
        ""
    } else {
        "WITH saga AS ("
    });
    q.push(
        "INSERT INTO saga_instances (id, name, version, state, data, error, stage, finished_at)
         VALUES (",
    );
    q.separated(", ")
        .push_bind(inst.id.as_uuid())
        .push_bind(&inst.name)
        .push_bind(inst.version)
        .push_bind(inst.state.as_str())
        .push_bind(inst.data.to_string())
        .push_unseparated("::jsonb")
        .push_bind(inst.error.as_deref())
        .push_bind(inst.stage as i32)
        .push("CASE WHEN ")
        .push_bind_unseparated(inst.finished)
        .push_unseparated(" THEN now() END");
    q.push(")");
    q.push(INSTANCE_UPSERT);
    if !changed.is_empty() {
        q.push(") ");
        q.push(STEP_INSERT);
        q.push_values(changed, |mut b, s| postgres_step_values(&mut b, inst.id, s));
        q.push(STEP_UPSERT);
    }
    q.build().execute(&mut *c).await?;
    Ok(())
}

/// Binds a step's row as [`STEP_INSERT`] lists its columns.
fn postgres_step_values(
    b: &mut sqlx::query_builder::Separated<'_, sqlx::Postgres, &'static str>,
    saga: SagaId,
    s: &StepRow,
) {
    b.push_bind(saga.as_uuid())
        .push_bind(s.idx as i32)
        .push_bind(s.stage as i32)
        .push_bind(&s.name)
        .push_bind(&s.destination)
        .push_bind(s.state.as_str())
        .push_bind(s.attempts as i32)
        .push_bind(s.command_id)
        .push_bind(s.timer_id)
        .push_bind(s.input.as_ref().map(Value::to_string))
        .push_unseparated("::jsonb")
        .push_bind(s.output.as_ref().map(Value::to_string))
        .push_unseparated("::jsonb")
        .push_bind(s.error.as_deref())
        .push_bind(s.compensation_destination.as_deref())
        .push_bind(s.compensation_payload.as_ref().map(Value::to_string))
        .push_unseparated("::jsonb")
        .push_bind(s.compensation_state.map(|c| c.as_str()))
        .push_bind(s.compensation_attempts as i32)
        .push_bind(s.compensation_message_id)
        .push_bind(s.compensation_error.as_deref())
        .push("to_timestamp(")
        .push_bind_unseparated(s.deadline_ms)
        .push_unseparated(" / 1000.0)")
        .push("to_timestamp(")
        .push_bind_unseparated(s.dispatched_at)
        .push_unseparated(" / 1000.0)")
        .push("to_timestamp(")
        .push_bind_unseparated(s.replied_at)
        .push_unseparated(" / 1000.0)")
        .push("to_timestamp(")
        .push_bind_unseparated(s.compensated_at)
        .push_unseparated(" / 1000.0)");
}

/// Inserts new instances and their steps on PostgreSQL in one statement (the steps'
/// foreign key is checked at its end, when the instances are there).
async fn insert_postgres(c: &mut PgConnection, insts: &[&Instance]) -> Result<()> {
    let steps: Vec<(SagaId, &StepRow)> = insts
        .iter()
        .flat_map(|i| i.steps.values().map(move |s| (i.id, s)))
        .collect();
    let mut q = sqlx::QueryBuilder::<sqlx::Postgres>::new(if steps.is_empty() {
        ""
    } else {
        "WITH saga AS ("
    });
    q.push("INSERT INTO saga_instances (id, name, version, state, data, error, stage, finished_at) ");
    q.push_values(insts, |mut b, inst| {
        b.push_bind(inst.id.as_uuid())
            .push_bind(&inst.name)
            .push_bind(inst.version)
            .push_bind(inst.state.as_str())
            .push_bind(inst.data.to_string())
            .push_unseparated("::jsonb")
            .push_bind(inst.error.as_deref())
            .push_bind(inst.stage as i32)
            .push("CASE WHEN ")
            .push_bind_unseparated(inst.finished)
            .push_unseparated(" THEN now() END");
    });
    if !steps.is_empty() {
        q.push(") ");
        q.push(STEP_INSERT);
        q.push_values(&steps, |mut b, (saga, s)| postgres_step_values(&mut b, *saga, s));
    }
    q.build().execute(&mut *c).await?;
    Ok(())
}
}
