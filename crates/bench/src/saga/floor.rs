//! The floor of the `saga` bench: the runtime's row writes, in the same transactions,
//! by hand in plain sqlx ([`Sql`] holds each statement in both dialects,
//! [`FloorTx::exec`] runs it), handed on through an in-memory queue. The same
//! transactions with each kind of row written for all their hops in one statement
//! ([`Sql::pg_set`], PostgreSQL) are the set reference.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, bail};
use serde_json::json;
use sqlx::{Postgres, Sqlite, Transaction};
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinSet;
use uuid::Uuid;

use super::{ORCHESTRATOR, Run, SAGA, STEPS, Scenario, check_and_measure, drive};
use crate::db::Backend;
use crate::outbox::{self, Plain};

/// One saga, as the floor's messages carry it.
#[derive(Debug, Clone, Copy)]
struct SagaRef {
    id: Uuid,
    n: u64,
    fail: bool,
}

/// A message handed from one floor transaction to the next.
#[derive(Debug, Clone, Copy)]
enum Hop {
    /// A command (or, `comp`, a compensation) for the agent of step `idx`.
    Agent {
        saga: SagaRef,
        idx: usize,
        comp: bool,
        message: Uuid,
    },
    /// The agent's reply to the orchestrator.
    Orchestrator {
        saga: SagaRef,
        idx: usize,
        comp: bool,
        ok: bool,
        message: Uuid,
    },
}

/// What a floor transaction leads to.
enum Next {
    Hop(Hop),
    Done,
}

/// A statement in both dialects, with the same parameters in the same order. Times
/// are Unix ms; PostgreSQL converts them with `to_timestamp`.
struct Sql {
    sqlite: &'static str,
    pg: &'static str,
    /// The same rows for many hops at once, on PostgreSQL: each parameter an array
    /// (`unnest`), one statement per kind per transaction.
    pg_set: &'static str,
}

/// A parameter, bound as each backend stores it.
enum Arg {
    /// UUID on PostgreSQL, its text on SQLite.
    Id(Uuid),
    Text(String),
    OptText(Option<String>),
    Int(i32),
    Ms(i64),
    Bool(bool),
}

enum FloorTx {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
    /// PostgreSQL, each kind of statement's rows collected and written at the commit in
    /// one statement per kind (in the order each kind first came).
    PostgresSets(
        Transaction<'static, Postgres>,
        Vec<(&'static Sql, Vec<Vec<Arg>>)>,
    ),
}

/// One column of a set statement's rows, as the array PostgreSQL binds.
enum Column {
    Id(Vec<Uuid>),
    Text(Vec<String>),
    OptText(Vec<Option<String>>),
    Int(Vec<i32>),
    Ms(Vec<i64>),
    Bool(Vec<bool>),
}

impl Column {
    fn push(columns: &mut Vec<Self>, at: usize, arg: Arg) -> anyhow::Result<()> {
        if columns.len() == at {
            columns.push(match &arg {
                Arg::Id(_) => Self::Id(Vec::new()),
                Arg::Text(_) => Self::Text(Vec::new()),
                Arg::OptText(_) => Self::OptText(Vec::new()),
                Arg::Int(_) => Self::Int(Vec::new()),
                Arg::Ms(_) => Self::Ms(Vec::new()),
                Arg::Bool(_) => Self::Bool(Vec::new()),
            });
        }
        match (&mut columns[at], arg) {
            (Self::Id(v), Arg::Id(x)) => v.push(x),
            (Self::Text(v), Arg::Text(x)) => v.push(x),
            (Self::OptText(v), Arg::OptText(x)) => v.push(x),
            (Self::Int(v), Arg::Int(x)) => v.push(x),
            (Self::Ms(v), Arg::Ms(x)) => v.push(x),
            (Self::Bool(v), Arg::Bool(x)) => v.push(x),
            _ => bail!("parameter {} changes type between rows", at + 1),
        }
        Ok(())
    }
}

impl FloorTx {
    async fn begin(plain: &Plain, sets: bool) -> anyhow::Result<Self> {
        Ok(match plain {
            Plain::Sqlite(pool) => Self::Sqlite(pool.begin_with("BEGIN IMMEDIATE").await?),
            Plain::Postgres(pool) if sets => Self::PostgresSets(pool.begin().await?, Vec::new()),
            Plain::Postgres(pool) => Self::Postgres(pool.begin().await?),
        })
    }

    async fn exec(&mut self, sql: &'static Sql, args: Vec<Arg>) -> anyhow::Result<()> {
        match self {
            Self::PostgresSets(_, kinds) => {
                match kinds.iter_mut().find(|(k, _)| k.pg_set == sql.pg_set) {
                    Some((_, rows)) => rows.push(args),
                    None => kinds.push((sql, vec![args])),
                }
            }
            Self::Sqlite(tx) => {
                let mut q = sqlx::query(sql.sqlite);
                for arg in args {
                    q = match arg {
                        Arg::Id(u) => q.bind(u.to_string()),
                        Arg::Text(s) => q.bind(s),
                        Arg::OptText(s) => q.bind(s),
                        Arg::Int(i) => q.bind(i64::from(i)),
                        Arg::Ms(ms) => q.bind(ms),
                        Arg::Bool(b) => q.bind(b),
                    };
                }
                q.execute(&mut **tx).await?;
            }
            Self::Postgres(tx) => {
                let mut q = sqlx::query(sql.pg);
                for arg in args {
                    q = match arg {
                        Arg::Id(u) => q.bind(u),
                        Arg::Text(s) => q.bind(s),
                        Arg::OptText(s) => q.bind(s),
                        Arg::Int(i) => q.bind(i),
                        Arg::Ms(ms) => q.bind(ms),
                        Arg::Bool(b) => q.bind(b),
                    };
                }
                q.execute(&mut **tx).await?;
            }
        }
        Ok(())
    }

    async fn commit(self) -> anyhow::Result<()> {
        match self {
            Self::Sqlite(tx) => tx.commit().await?,
            Self::Postgres(tx) => tx.commit().await?,
            Self::PostgresSets(mut tx, kinds) => {
                for (sql, rows) in kinds {
                    let mut columns = Vec::new();
                    for row in rows {
                        for (at, arg) in row.into_iter().enumerate() {
                            Column::push(&mut columns, at, arg)?;
                        }
                    }
                    let mut q = sqlx::query(sql.pg_set);
                    for column in columns {
                        q = match column {
                            Column::Id(v) => q.bind(v),
                            Column::Text(v) => q.bind(v),
                            Column::OptText(v) => q.bind(v),
                            Column::Int(v) => q.bind(v),
                            Column::Ms(v) => q.bind(v),
                            Column::Bool(v) => q.bind(v),
                        };
                    }
                    q.execute(&mut *tx).await?;
                }
                tx.commit().await?;
            }
        }
        Ok(())
    }
}

const INSERT_INSTANCE: Sql = Sql {
    sqlite:
        "INSERT INTO saga_instances (id, name, version, state, data, stage, created_at, updated_at)
             VALUES (?1, ?2, 1, 'running', ?3, 0, ?4, ?4)",
    pg: "INSERT INTO saga_instances (id, name, version, state, data, stage, created_at, updated_at)
         VALUES ($1, $2, 1, 'running', $3::jsonb, 0, to_timestamp($4 / 1000.0),
                 to_timestamp($4 / 1000.0))",
    pg_set:
        "INSERT INTO saga_instances (id, name, version, state, data, stage, created_at, updated_at)
             SELECT u.id, u.name, 1, 'running', u.data::jsonb, 0, to_timestamp(u.now / 1000.0),
                    to_timestamp(u.now / 1000.0)
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int8[]) AS u(id, name, data, now)",
};

/// (saga, idx, name, destination, command id, input, compensation destination,
/// compensation payload, compensation state, now)
const INSERT_STEP: Sql = Sql {
    sqlite: "INSERT INTO saga_steps (saga_id, idx, stage, name, destination, state, attempts,
                command_id, input, compensation_destination, compensation_payload,
                compensation_state, dispatched_at)
             VALUES (?1, ?2, ?2, ?3, ?4, 'dispatched', 1, ?5, ?6, ?7, ?8, ?9, ?10)",
    pg: "INSERT INTO saga_steps (saga_id, idx, stage, name, destination, state, attempts,
            command_id, input, compensation_destination, compensation_payload,
            compensation_state, dispatched_at)
         VALUES ($1, $2, $2, $3, $4, 'dispatched', 1, $5, $6::jsonb, $7, $8::jsonb, $9,
                 to_timestamp($10 / 1000.0))",
    pg_set: "INSERT INTO saga_steps (saga_id, idx, stage, name, destination, state, attempts,
                command_id, input, compensation_destination, compensation_payload,
                compensation_state, dispatched_at)
             SELECT u.s, u.i, u.i, u.n, u.d, 'dispatched', 1, u.c, u.inp::jsonb, u.cd,
                    u.cp::jsonb, u.cs, to_timestamp(u.now / 1000.0)
             FROM unnest($1::uuid[], $2::int4[], $3::text[], $4::text[], $5::uuid[],
                         $6::text[], $7::text[], $8::text[], $9::text[], $10::int8[])
                  AS u(s, i, n, d, c, inp, cd, cp, cs, now)",
};

/// (id, destination, key, payload, headers, now): the store's INSERT.
const INSERT_OUTBOX: Sql = Sql {
    sqlite: "INSERT INTO outbox (id, destination, key, payload, headers, available_at, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)
             ON CONFLICT (id) DO NOTHING",
    pg: "INSERT INTO outbox (id, destination, key, payload, headers, available_at)
         VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, to_timestamp($6 / 1000.0))
         ON CONFLICT (id) DO NOTHING",
    pg_set: "INSERT INTO outbox (id, destination, key, payload, headers, available_at)
             SELECT u.id, u.d, u.k, u.p::jsonb, u.h::jsonb, to_timestamp(u.now / 1000.0)
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int8[])
                  AS u(id, d, k, p, h, now)
             ON CONFLICT (id) DO NOTHING",
};

/// (consumer, message id, now): the store's receive.
const INSERT_INBOX: Sql = Sql {
    sqlite: "INSERT INTO inbox (consumer, message_id, received_at) VALUES (?1, ?2, ?3)
             ON CONFLICT DO NOTHING",
    pg: "INSERT INTO inbox (consumer, message_id, received_at)
         VALUES ($1, $2, to_timestamp($3 / 1000.0))
         ON CONFLICT DO NOTHING",
    pg_set: "INSERT INTO inbox (consumer, message_id, received_at)
             SELECT u.c, u.m, to_timestamp(u.now / 1000.0)
             FROM unnest($1::text[], $2::uuid[], $3::int8[]) AS u(c, m, now)
             ON CONFLICT DO NOTHING",
};

/// (saga, state, stage, error, finished, now)
const UPDATE_INSTANCE: Sql = Sql {
    sqlite: "UPDATE saga_instances SET state = ?2, stage = ?3, error = ?4, updated_at = ?6,
                 finished_at = CASE WHEN ?5 THEN ?6 END
             WHERE id = ?1",
    pg: "UPDATE saga_instances SET state = $2, stage = $3, error = $4,
             updated_at = to_timestamp($6 / 1000.0),
             finished_at = CASE WHEN $5 THEN to_timestamp($6 / 1000.0) END
         WHERE id = $1",
    pg_set: "UPDATE saga_instances s SET state = u.st, stage = u.sg, error = u.e,
                 updated_at = to_timestamp(u.now / 1000.0),
                 finished_at = CASE WHEN u.f THEN to_timestamp(u.now / 1000.0) END
             FROM unnest($1::uuid[], $2::text[], $3::int4[], $4::text[], $5::bool[], $6::int8[])
                  AS u(id, st, sg, e, f, now)
             WHERE s.id = u.id",
};

/// (saga, idx, state, output, error, now)
const UPDATE_STEP: Sql = Sql {
    sqlite: "UPDATE saga_steps SET state = ?3, output = ?4, error = ?5, replied_at = ?6
             WHERE saga_id = ?1 AND idx = ?2",
    pg: "UPDATE saga_steps SET state = $3, output = $4::jsonb, error = $5,
             replied_at = to_timestamp($6 / 1000.0)
         WHERE saga_id = $1 AND idx = $2",
    pg_set: "UPDATE saga_steps s SET state = u.st, output = u.o::jsonb, error = u.e,
                 replied_at = to_timestamp(u.now / 1000.0)
             FROM unnest($1::uuid[], $2::int4[], $3::text[], $4::text[], $5::text[], $6::int8[])
                  AS u(id, i, st, o, e, now)
             WHERE s.saga_id = u.id AND s.idx = u.i",
};

/// (saga, idx, compensation message id)
const COMPENSATION_SENT: Sql = Sql {
    sqlite: "UPDATE saga_steps SET compensation_state = 'dispatched',
                 compensation_attempts = compensation_attempts + 1, compensation_message_id = ?3
             WHERE saga_id = ?1 AND idx = ?2",
    pg: "UPDATE saga_steps SET compensation_state = 'dispatched',
             compensation_attempts = compensation_attempts + 1, compensation_message_id = $3
         WHERE saga_id = $1 AND idx = $2",
    pg_set: "UPDATE saga_steps s SET compensation_state = 'dispatched',
                 compensation_attempts = s.compensation_attempts + 1, compensation_message_id = u.m
             FROM unnest($1::uuid[], $2::int4[], $3::uuid[]) AS u(id, i, m)
             WHERE s.saga_id = u.id AND s.idx = u.i",
};

/// (saga, idx, now)
const COMPENSATION_DONE: Sql = Sql {
    sqlite: "UPDATE saga_steps SET compensation_state = 'done', compensated_at = ?3
             WHERE saga_id = ?1 AND idx = ?2",
    pg: "UPDATE saga_steps SET compensation_state = 'done',
             compensated_at = to_timestamp($3 / 1000.0)
         WHERE saga_id = $1 AND idx = $2",
    pg_set: "UPDATE saga_steps s SET compensation_state = 'done',
                 compensated_at = to_timestamp(u.now / 1000.0)
             FROM unnest($1::uuid[], $2::int4[], $3::int8[]) AS u(id, i, now)
             WHERE s.saga_id = u.id AND s.idx = u.i",
};

fn data_json(saga: SagaRef) -> String {
    json!({ "n": saga.n, "fail": saga.fail }).to_string()
}

/// The outbox row of a command or compensation to step `idx`'s agent.
fn command_row(saga: SagaRef, idx: usize, comp: bool, id: Uuid, now: i64) -> Vec<Arg> {
    let (name, destination) = STEPS[idx];
    let payload = if comp {
        saga.n.to_string()
    } else {
        data_json(saga)
    };
    let headers = json!({
        "kind": if comp { "compensate" } else { "command" },
        "reply_to": ORCHESTRATOR,
        "saga_id": saga.id.to_string(),
        "step": idx.to_string(),
        "step_name": name,
    });
    vec![
        Arg::Id(id),
        Arg::Text(destination.to_owned()),
        Arg::OptText(Some(format!("{}:{idx}", saga.id))),
        Arg::Text(payload),
        Arg::Text(headers.to_string()),
        Arg::Ms(now),
    ]
}

/// Writes step `idx`'s row (dispatched, with its compensation recorded) and its command.
async fn dispatch(tx: &mut FloorTx, saga: SagaRef, idx: usize, now: i64) -> anyhow::Result<Hop> {
    let (name, destination) = STEPS[idx];
    let command = Uuid::now_v7();
    let undoable = idx < 2;
    tx.exec(
        &INSERT_STEP,
        vec![
            Arg::Id(saga.id),
            Arg::Int(idx as i32),
            Arg::Text(name.to_owned()),
            Arg::Text(destination.to_owned()),
            Arg::Id(command),
            Arg::Text(data_json(saga)),
            Arg::OptText(undoable.then(|| destination.to_owned())),
            Arg::OptText(undoable.then(|| saga.n.to_string())),
            Arg::OptText(undoable.then(|| "recorded".to_owned())),
            Arg::Ms(now),
        ],
    )
    .await?;
    tx.exec(&INSERT_OUTBOX, command_row(saga, idx, false, command, now))
        .await?;
    Ok(Hop::Agent {
        saga,
        idx,
        comp: false,
        message: command,
    })
}

/// Sends the compensation of step `idx`.
async fn compensate(tx: &mut FloorTx, saga: SagaRef, idx: usize, now: i64) -> anyhow::Result<Hop> {
    let message = Uuid::now_v7();
    tx.exec(
        &COMPENSATION_SENT,
        vec![Arg::Id(saga.id), Arg::Int(idx as i32), Arg::Id(message)],
    )
    .await?;
    tx.exec(&INSERT_OUTBOX, command_row(saga, idx, true, message, now))
        .await?;
    Ok(Hop::Agent {
        saga,
        idx,
        comp: true,
        message,
    })
}

async fn set_instance(
    tx: &mut FloorTx,
    saga: SagaRef,
    state: &str,
    stage: usize,
    error: Option<&str>,
    now: i64,
) -> anyhow::Result<()> {
    let finished = matches!(state, "completed" | "compensated");
    tx.exec(
        &UPDATE_INSTANCE,
        vec![
            Arg::Id(saga.id),
            Arg::Text(state.to_owned()),
            Arg::Int(stage as i32),
            Arg::OptText(error.map(str::to_owned)),
            Arg::Bool(finished),
            Arg::Ms(now),
        ],
    )
    .await
}

/// The start transaction of sagas `first..first + count`; returns their first hops.
async fn floor_start(
    plain: &Plain,
    scenario: Scenario,
    first: usize,
    count: usize,
    sets: bool,
) -> anyhow::Result<Vec<Hop>> {
    let now = outbox::now_ms();
    let mut tx = FloorTx::begin(plain, sets).await?;
    let mut hops = Vec::with_capacity(count);
    for i in first..first + count {
        let n = i as u64;
        let saga = SagaRef {
            id: Uuid::now_v7(),
            n,
            fail: scenario.fails(n),
        };
        tx.exec(
            &INSERT_INSTANCE,
            vec![
                Arg::Id(saga.id),
                Arg::Text(SAGA.to_owned()),
                Arg::Text(data_json(saga)),
                Arg::Ms(now),
            ],
        )
        .await?;
        hops.push(dispatch(&mut tx, saga, 0, now).await?);
    }
    tx.commit().await?;
    Ok(hops)
}

/// One delivery's writes, in `tx`.
async fn floor_hop(tx: &mut FloorTx, hop: Hop) -> anyhow::Result<Next> {
    let now = outbox::now_ms();
    let next = match hop {
        Hop::Agent {
            saga,
            idx,
            comp,
            message,
        } => {
            let (name, destination) = STEPS[idx];
            tx.exec(
                &INSERT_INBOX,
                vec![
                    Arg::Text(destination.to_owned()),
                    Arg::Id(message),
                    Arg::Ms(now),
                ],
            )
            .await?;
            let ok = comp || idx < 2 || !saga.fail;
            let outcome = if ok {
                json!({ "ok": "done" })
            } else {
                json!({ "fatal": "declined" })
            };
            let headers = json!({
                "kind": "reply",
                "causation_id": message.to_string(),
                "saga_id": saga.id.to_string(),
                "step": idx.to_string(),
                "step_name": name,
            });
            let reply = Uuid::now_v7();
            tx.exec(
                &INSERT_OUTBOX,
                vec![
                    Arg::Id(reply),
                    Arg::Text(ORCHESTRATOR.to_owned()),
                    Arg::OptText(None),
                    Arg::Text(outcome.to_string()),
                    Arg::Text(headers.to_string()),
                    Arg::Ms(now),
                ],
            )
            .await?;
            Next::Hop(Hop::Orchestrator {
                saga,
                idx,
                comp,
                ok,
                message: reply,
            })
        }
        Hop::Orchestrator {
            saga,
            idx,
            comp,
            ok,
            message,
        } => {
            tx.exec(
                &INSERT_INBOX,
                vec![
                    Arg::Text(ORCHESTRATOR.to_owned()),
                    Arg::Id(message),
                    Arg::Ms(now),
                ],
            )
            .await?;
            let step = |state: &str, output: Option<&str>, error: Option<&str>| {
                vec![
                    Arg::Id(saga.id),
                    Arg::Int(idx as i32),
                    Arg::Text(state.to_owned()),
                    Arg::OptText(output.map(str::to_owned)),
                    Arg::OptText(error.map(str::to_owned)),
                    Arg::Ms(now),
                ]
            };
            match (comp, ok) {
                (false, true) => {
                    tx.exec(&UPDATE_STEP, step("succeeded", Some("\"done\""), None))
                        .await?;
                    if idx + 1 < STEPS.len() {
                        let next = dispatch(tx, saga, idx + 1, now).await?;
                        set_instance(tx, saga, "running", idx + 1, None, now).await?;
                        Next::Hop(next)
                    } else {
                        set_instance(tx, saga, "completed", idx, None, now).await?;
                        Next::Done
                    }
                }
                (false, false) => {
                    tx.exec(&UPDATE_STEP, step("failed", None, Some("declined")))
                        .await?;
                    let error = format!("step `{}` failed: declined", STEPS[idx].0);
                    set_instance(tx, saga, "compensating", idx, Some(&error), now).await?;
                    // The pivot has nothing to undo: compensate the step before it.
                    Next::Hop(compensate(tx, saga, idx - 1, now).await?)
                }
                (true, _) => {
                    tx.exec(
                        &COMPENSATION_DONE,
                        vec![Arg::Id(saga.id), Arg::Int(idx as i32), Arg::Ms(now)],
                    )
                    .await?;
                    let error = format!("step `{}` failed: declined", STEPS[2].0);
                    if idx > 0 {
                        let next = compensate(tx, saga, idx - 1, now).await?;
                        set_instance(tx, saga, "compensating", 2, Some(&error), now).await?;
                        Next::Hop(next)
                    } else {
                        set_instance(tx, saga, "compensated", 2, Some(&error), now).await?;
                        Next::Done
                    }
                }
            }
        }
    };
    Ok(next)
}

/// The floor's hops, each in a transaction of its own (`batch` 1), or, for the
/// physical reference, up to `batch` of those ready at once in one transaction.
pub(super) async fn floor_run(
    backend: Backend,
    url: &str,
    scenario: Scenario,
    n: usize,
    workers: usize,
    batch: usize,
    sets: bool,
) -> anyhow::Result<Run> {
    let plain = Plain::open(backend, url).await?;
    let (queue, inbox) = mpsc::unbounded_channel::<Hop>();
    let inbox = Arc::new(Mutex::new(inbox));
    let finished = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..workers {
        let (plain, queue, inbox, finished) = (
            plain.clone(),
            queue.clone(),
            Arc::clone(&inbox),
            Arc::clone(&finished),
        );
        tasks.spawn(async move {
            loop {
                let mut hops = Vec::with_capacity(batch);
                {
                    let mut inbox = inbox.lock().await;
                    let Some(hop) = inbox.recv().await else {
                        return anyhow::Ok(());
                    };
                    hops.push(hop);
                    while hops.len() < batch {
                        match inbox.try_recv() {
                            Ok(hop) => hops.push(hop),
                            Err(_) => break,
                        }
                    }
                }
                let mut tx = FloorTx::begin(&plain, sets).await?;
                let mut nexts = Vec::with_capacity(hops.len());
                for hop in hops {
                    nexts.push(floor_hop(&mut tx, hop).await?);
                }
                tx.commit().await?;
                for next in nexts {
                    match next {
                        Next::Hop(next) => queue.send(next).context("the floor's queue closed")?,
                        Next::Done => {
                            finished.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                }
            }
        });
    }
    let tasks = Arc::new(std::sync::Mutex::new(tasks));
    let elapsed = drive(
        n,
        |first, count| {
            let (plain, queue) = (&plain, &queue);
            async move {
                for hop in floor_start(plain, scenario, first, count, sets).await? {
                    queue.send(hop).context("the floor's queue closed")?;
                }
                Ok(())
            }
        },
        |started| {
            let finished = Arc::clone(&finished);
            let tasks = Arc::clone(&tasks);
            async move {
                // A worker that stopped has failed: say why instead of waiting.
                let failed = tasks
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .try_join_next();
                if let Some(done) = failed {
                    done??;
                    bail!("a floor worker stopped");
                }
                Ok(started - finished.load(Ordering::Acquire))
            }
        },
    )
    .await;
    if let Ok(mut set) = tasks.lock() {
        set.abort_all();
    }
    plain.close().await;
    let elapsed = elapsed?;
    let latencies = check_and_measure(backend, url, scenario, n).await?;
    Ok(Run {
        rate: n as f64 / elapsed.as_secs_f64(),
        latencies,
        hops_per_commit: None,
        handed_share: None,
    })
}
