//! One figure of the saga bench: the runtime, the floor and the references run in
//! alternation, each several times, and the run of median rate kept.

use super::drive::Run;
use super::setup::{PHYSICAL_BATCH, Scenario, Sizes};
use super::{floor, runtime_side};
use crate::db::{Backend, Scratch};
use crate::outbox;
use crate::report::percentile;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Runtime,
    Floor,
    /// The physical reference: the floor's writes, up to [`PHYSICAL_BATCH`] hops per
    /// transaction.
    Batched,
    /// The set reference (PostgreSQL): the physical reference's transactions, each
    /// kind of row written for all their hops in one statement.
    Sets,
}

/// (runtime, floor, physical reference, set reference on PostgreSQL): the runs of
/// median rate.
pub(super) async fn figure(
    backend: Backend,
    scenario: Scenario,
    sizes: Sizes,
    workers: usize,
    runtime_only: bool,
    scratch: &mut Scratch,
) -> anyhow::Result<(Run, Run, Run, Option<Run>)> {
    let mut runs = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let sets = backend == Backend::Postgres;
    for round in 0..sizes.rounds {
        let order: &[Side] = if runtime_only {
            &[Side::Runtime]
        } else if round % 2 == 0 {
            &[Side::Floor, Side::Batched, Side::Sets, Side::Runtime]
        } else {
            &[Side::Runtime, Side::Sets, Side::Batched, Side::Floor]
        };
        for &side in order {
            if side == Side::Sets && !sets {
                continue;
            }
            let url = scratch.fresh_url(backend).await?;
            let run = match side {
                Side::Runtime => {
                    runtime_side::runtime_run(backend, &url, scenario, sizes.sagas, workers).await?
                }
                Side::Floor => {
                    floor::floor_run(backend, &url, scenario, sizes.sagas, workers, 1, false)
                        .await?
                }
                Side::Batched | Side::Sets => {
                    floor::floor_run(
                        backend,
                        &url,
                        scenario,
                        sizes.sagas,
                        workers,
                        PHYSICAL_BATCH,
                        side == Side::Sets,
                    )
                    .await?
                }
            };
            eprintln!(
                "{:<8} {:<12} round {}/{}  {:<7} {:>8.0} sagas/s  p50 {:>6.1} ms  p99 {:>6.1} ms{}",
                backend.name(),
                scenario.name(),
                round + 1,
                sizes.rounds,
                match side {
                    Side::Runtime => "runtime",
                    Side::Floor => "floor",
                    Side::Batched => "physical",
                    Side::Sets => "sets",
                },
                run.rate,
                percentile(&run.latencies, 50.0),
                percentile(&run.latencies, 99.0),
                run.cpu_per_saga
                    .map(|(m, p)| format!("  cpu/saga {m:.3} ms (this process {p:.3})"))
                    .unwrap_or_default(),
            );
            match side {
                Side::Runtime => runs.0.push(run),
                Side::Floor => runs.1.push(run),
                Side::Batched => runs.2.push(run),
                Side::Sets => runs.3.push(run),
            }
        }
    }
    let sets = (!runs.3.is_empty()).then(|| pooled(runs.3));
    Ok((pooled(runs.0), pooled(runs.1), pooled(runs.2), sets))
}

/// The median rate of `runs`, and the latencies of all their sagas together.
pub(super) fn pooled(runs: Vec<Run>) -> Run {
    let rate = outbox::median(runs.iter().map(|r| r.rate).collect());
    let mean = |f: fn(&Run) -> Option<f64>| {
        let v: Vec<f64> = runs.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let hops_per_commit = mean(|r| r.hops_per_commit);
    let handed_share = mean(|r| r.handed_share);
    let cpu_per_saga =
        mean(|r| r.cpu_per_saga.map(|c| c.0)).zip(mean(|r| r.cpu_per_saga.map(|c| c.1)));
    let mut latencies: Vec<f64> = runs.into_iter().flat_map(|r| r.latencies).collect();
    latencies.sort_by(f64::total_cmp);
    Run {
        rate,
        latencies,
        hops_per_commit,
        handed_share,
        cpu_per_saga,
    }
}
