//! How a run of the saga bench is driven and measured, by the runtime and the floors
//! alike: sagas started in a window until all are, then their final states checked
//! and their latencies read.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure};

use super::setup::Scenario;
use crate::db::Backend;
use crate::outbox::Plain;

/// Sagas per start transaction.
pub(super) const START_BATCH: usize = 50;
/// At most this many sagas unfinished.
pub(super) const WINDOW: usize = 200;
/// How often the driver looks at the unfinished count.
pub(super) const POLL: Duration = Duration::from_millis(10);

/// What one run measured.
#[derive(Debug, Clone)]
pub(super) struct Run {
    pub(super) rate: f64,
    /// Per-saga latencies, ms, sorted.
    pub(super) latencies: Vec<f64>,
    /// The runtime's hops per shared commit (group commit).
    pub(super) hops_per_commit: Option<f64>,
    /// The runtime's deliveries taken by direct handover, of all its deliveries.
    pub(super) handed_share: Option<f64>,
    /// CPU per saga, ms: the machine's (this process, the database server, anything
    /// else) and this process's, from the first start to the last saga's end.
    pub(super) cpu_per_saga: Option<(f64, f64)>,
}

/// A driven run: how long it took and the CPU it used.
pub(super) struct Driven {
    pub(super) elapsed: Duration,
    pub(super) cpu: Option<crate::cpu::Used>,
}

impl Driven {
    /// The rate of `n` sagas.
    pub(super) fn rate(&self, n: usize) -> f64 {
        n as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU per saga of `n` sagas, ms (machine, this process).
    pub(super) fn cpu_per_saga(&self, n: usize) -> Option<(f64, f64)> {
        let per = |d: Duration| d.as_secs_f64() * 1000.0 / n.max(1) as f64;
        self.cpu.map(|u| (per(u.machine), per(u.process)))
    }
}

/// Starts sagas `START_BATCH` at a time while at most `WINDOW - START_BATCH` are
/// unfinished, until `n` are started and none is unfinished. `start(first, count)`
/// starts sagas `first..first + count` in one transaction; `unfinished(started)`
/// counts those not terminal. Returns the elapsed time and the CPU used.
pub(super) async fn drive<S, SF, U, UF>(
    n: usize,
    mut start: S,
    mut unfinished: U,
) -> anyhow::Result<Driven>
where
    S: FnMut(usize, usize) -> SF,
    SF: Future<Output = anyhow::Result<()>>,
    U: FnMut(usize) -> UF,
    UF: Future<Output = anyhow::Result<usize>>,
{
    let begin = Instant::now();
    let cpu = crate::cpu::Cpu::now();
    let deadline = begin + Duration::from_secs(600);
    let mut started = 0;
    loop {
        let open = unfinished(started).await?;
        if started < n && open + START_BATCH <= WINDOW {
            let count = START_BATCH.min(n - started);
            start(started, count).await?;
            started += count;
            continue;
        }
        if started == n && open == 0 {
            return Ok(Driven {
                elapsed: begin.elapsed(),
                cpu: cpu.since(),
            });
        }
        if Instant::now() > deadline {
            bail!("{open} sagas still unfinished after 10 minutes ({started} of {n} started)");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Checks the final states (every saga terminal, the expected number compensated) and
/// returns the sorted latencies, ms.
pub(super) async fn check_and_measure(
    backend: Backend,
    url: &str,
    scenario: Scenario,
    n: usize,
) -> anyhow::Result<Vec<f64>> {
    let plain = Plain::open(backend, url).await?;
    let rows = plain.saga_rows().await?;
    plain.close().await;
    let failing = (0..n as u64).filter(|&i| scenario.fails(i)).count();
    let compensated = rows.iter().filter(|r| r.0 == "compensated").count();
    let completed = rows.iter().filter(|r| r.0 == "completed").count();
    ensure!(
        rows.len() == n && completed == n - failing && compensated == failing,
        "expected {} completed and {failing} compensated of {n}, found {completed} and \
         {compensated} of {}",
        n - failing,
        rows.len()
    );
    let mut ms: Vec<f64> = rows.iter().map(|r| (r.2 - r.1) as f64).collect();
    ms.sort_by(f64::total_cmp);
    Ok(ms)
}
