//! The nested shape of the `saga` bench: a parent of 2 steps, `step_p` (agent `agent_p`,
//! with a compensation) then, as its pivot, a child step that runs the flat bench saga
//! (3 steps, a pivot of its own) as a child saga (`Step::saga`). Happy path only. Its
//! rate (parents/s) is reported against the flat saga's happy rate of the same run: a
//! parent runs the child saga plus its own step, its start and the child's start and
//! answer: 4 agent steps and 2 sagas against the flat saga's 3 steps and 1 saga.

use agentsaga_relay::RelayConfig;
use agentsaga_runtime::Runtime;
use agentsaga_saga::{Saga, Step};
use anyhow::ensure;

use super::drive::drive;
use super::runtime_side::{Data, agent, definition};
use super::setup::{BENCH, SAGA, STEPS, Sizes};
use crate::db::Backend;

const PARENT: &str = "bench_parent";
const PARENT_AGENT: &str = "agent_p";

/// Runs `n` parents (each with its child) to completion: parents per second.
pub(super) async fn nested_run(
    _backend: Backend,
    url: &str,
    n: usize,
    workers: usize,
) -> anyhow::Result<f64> {
    let parent = Saga::<Data>::builder(PARENT, 1)
        .step(Step::new("step_p", PARENT_AGENT).compensate(PARENT_AGENT, |d: &Data| d.n))
        // The flat saga has a pivot: as a child it is its parent's pivot.
        .pivot(Step::saga("child", SAGA).forward_only())
        .build()?;
    let mut builder = Runtime::builder()
        .database(url)
        .saga(definition()?)
        .saga(parent)
        .relay_config(RelayConfig::default().workers(workers))
        .agent(crate::quick::QuickAgent {
            destination: PARENT_AGENT,
            answers: ("done", "done"),
            refuses: |_, _| false,
        });
    for (_, destination) in STEPS {
        builder = builder.agent(agent(destination));
    }
    let runtime = builder.start().await?;
    let store = runtime.store().clone();
    let elapsed = drive(
        n,
        |first, count| {
            let runtime = &runtime;
            async move {
                let data: Vec<Data> = (first..first + count)
                    .map(|i| Data {
                        n: i as u64,
                        fail: false,
                    })
                    .collect();
                let mut tx = runtime.store().begin().await?;
                runtime.start_sagas_in(&mut tx, PARENT, &data).await?;
                tx.commit().await?;
                Ok(())
            }
        },
        |started| {
            let store = store.clone();
            async move {
                let done = completed(&store, PARENT).await?;
                Ok(started.saturating_sub(done as usize))
            }
        },
    )
    .await;
    let (parents, children) = (
        completed(&store, PARENT).await,
        completed(&store, SAGA).await,
    );
    runtime.shutdown().await;
    let driven = elapsed?;
    ensure!(
        (parents?, children?) == (n as i64, n as i64),
        "not every parent and child completed"
    );
    Ok(driven.rate(n))
}

/// Sagas of `name` completed.
async fn completed(store: &agentsaga_core::Store, name: &str) -> anyhow::Result<i64> {
    let name = name.to_owned();
    let n = store
        .read(async move |conn| {
            agentsaga_core::Sql::new(
                "SELECT count(*) AS n FROM saga_instances WHERE state = 'completed' AND name = ?",
            )
            .bind(&name)
            .fetch_one(conn)
            .await?
            .int("n")
        })
        .await?;
    Ok(n)
}

/// The nested shape's figure on `backend`: the median of `sizes.rounds` runs, each in
/// a fresh database, against `flat` (the flat saga's happy rate, runtime side; 0 when
/// it did not run, and then the figure has no floor).
pub(super) async fn figure(
    backend: Backend,
    sizes: Sizes,
    workers: usize,
    scratch: &mut crate::db::Scratch,
    flat: f64,
) -> anyhow::Result<(crate::report::Figure, String)> {
    let mut rates = Vec::new();
    for _ in 0..sizes.rounds {
        let url = scratch.fresh_url(backend).await?;
        rates.push(nested_run(backend, &url, sizes.sagas, workers).await?);
    }
    rates.sort_by(f64::total_cmp);
    let rate = rates[rates.len() / 2];
    let figure = crate::report::Figure::new(BENCH, backend.name(), "nested_rate", rate, "sagas/s");
    // No floor when the flat happy shape did not run (`--shapes nested`).
    let figure = if flat > 0.0 {
        figure.with_floor(flat)
    } else {
        figure
    };
    let note = format!(
        "{} nested: parents of 2 steps (one agent step, one child saga of the flat 3-step \
         shape), happy path, {} per run: {rate:.0} parents/s; its ratio is against the flat \
         saga's happy rate ({flat:.0} sagas/s): a parent runs 4 agent steps and 2 sagas \
         against the flat saga's 3 steps and 1 saga",
        backend.name(),
        sizes.sagas
    );
    Ok((figure, note))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The nested shape runs on SQLite: every parent and child completes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_nested_shape_completes() {
        let url =
            agentsaga_core::testing::fresh_url(agentsaga_core::testing::Backend::Sqlite).await;
        let rate = nested_run(Backend::Sqlite, &url, 60, 8).await.unwrap();
        assert!(rate > 0.0);
    }
}
