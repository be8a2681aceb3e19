//! The floor of the `saga` bench: the runtime's row writes, in the same transactions,
//! by hand in plain sqlx ([`Sql`] holds each statement in both dialects,
//! [`FloorTx::exec`] runs it), handed on through an in-memory queue. The same
//! transactions with each kind of row written for all their hops in one statement
//! ([`Sql::pg_set`], PostgreSQL) are the set reference.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, bail};
use serde_json::json;
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinSet;
use uuid::Uuid;

use super::drive::{Run, check_and_measure, drive};
use super::setup::{ORCHESTRATOR, SAGA, STEPS, Scenario};
use crate::db::Backend;
use crate::outbox::{self, Plain};

mod sql;

use sql::*;

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
    let driven = drive(
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
    let driven = driven?;
    let latencies = check_and_measure(backend, url, scenario, n).await?;
    Ok(Run {
        rate: driven.rate(n),
        latencies,
        cpu_per_saga: driven.cpu_per_saga(n),
        hops_per_commit: None,
        handed_share: None,
    })
}
