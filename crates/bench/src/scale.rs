//! The `scale` bench: one burst of N trip-shaped sagas on the runtime's defaults, for
//! growing N, each on a fresh database in a fresh process.
//!
//! The saga has the shape of `examples/trip_booking.rs`: `reserve_flight` (agent
//! `flights`), then `reserve_hotel` (`hotels`) and `reserve_car` (`cars`) in parallel,
//! each with a cancel compensation to its own agent, then `charge_payment`
//! (`payments`, the pivot), then `send_confirmation` (`confirmations`); every step has
//! the example's retry policy and its 20 s `timeout` except the confirmation (as in the
//! example). The five agents are plain [`Agent`](agentsaga_runtime::Agent)s whose
//! handler writes nothing of its own and answers at once (the runtime's transaction
//! still records the inbox entry and enqueues the reply); nothing fails.
//!
//! For each N (1,000, 4,000, 16,000, 64,000; `--quick`: 500, 2,000; `--sizes` to
//! choose), the bench re-executes itself as the hidden `scale-child` on a fresh
//! database: a fresh runtime (`Runtime::builder()` with the agents and the saga,
//! nothing overridden, so admission control lets at most 1,000 sagas of the name be in
//! flight and queues the rest in `saga_starts`), which starts all N sagas as one burst
//! (`Runtime::start_saga_in`, [`START_CHUNK`] per transaction, one transaction after
//! the other, as fast as they commit), then waits for every saga to be terminal
//! (counting by state every [`POLL`], and no start left waiting; it fails past
//! [`patience`]). The child prints one JSON line of results; progress goes to stderr
//! every [`PROGRESS`]: sagas finished, in flight and waiting, the interval's rate, the
//! process's CPU and the machine's, RSS, the relay's deliveries and their latency, and
//! how long an empty transaction took (on SQLite: the wait for the one writer).
//!
//! Per N: `rate_n{N}` (N / first start → last `finished_at`), `completed_share_n{N}`,
//! `p99_latency_n{N}` (`finished_at - created_at` of `saga_instances`: from the saga's
//! admission, so without its wait in `saga_starts`; on PostgreSQL both are transaction
//! start times), `p99_latency_end_to_end_n{N}` (from the commit of its start
//! transaction, so with that wait), `peak_rss_n{N}` (the child's
//! `VmHWM`, MiB) and `db_size_n{N}` (MiB: SQLite file + WAL; PostgreSQL
//! `pg_database_size`), measured when the last saga is done. Then
//! `rate_ratio_largest_smallest` and `rss_ratio_largest_smallest`.
//!
//! Here the parent: the arguments, one child per N and the report; the child, its
//! runtime and its measurements are in [`child`](mod@child).

mod child;

pub(crate) use child::{ChildArgs, child, rss_mib};

use std::process::Stdio;
use std::time::{Duration, Instant};

use agentsaga_saga::DEFAULT_MAX_IN_FLIGHT;
use anyhow::{Context, ensure};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::Common;
use crate::db::{Backend, Scratch};
use crate::report::{Figure, Report, Target};

const BENCH: &str = "scale";
const SAGA: &str = "trip";
/// Sagas started per transaction.
const START_CHUNK: usize = 500;
/// How often the child counts the sagas by state.
const POLL: Duration = Duration::from_millis(200);
/// How often the child reports progress on stderr.
const PROGRESS: Duration = Duration::from_secs(2);
/// How long one N may take after its burst before the run fails: this, or
/// [`PATIENCE_PER_SAGA`] per saga if longer (25 sagas/s at 64,000).
const PATIENCE: Duration = Duration::from_secs(600);
const PATIENCE_PER_SAGA: Duration = Duration::from_millis(40);
/// The step timeout, as in the example.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);
/// Targets from the issue.
const RATE_RATIO_TARGET: f64 = 0.8;
const RSS_RATIO_TARGET: f64 = 2.0;
/// Sizes.
const FULL_SIZES: [usize; 4] = [1_000, 4_000, 16_000, 64_000];
const QUICK_SIZES: [usize; 2] = [500, 2_000];
/// The agents' destinations.
const AGENTS: [&str; 5] = ["flights", "hotels", "cars", "payments", "confirmations"];

/// `scale` options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: Common,
    /// The burst sizes, comma-separated (default 1000,4000,16000,64000; --quick:
    /// 500,2000).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
}

/// What the child measured, printed as one JSON line.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Outcome {
    sagas: usize,
    completed: usize,
    /// Terminal or stuck, but not completed.
    other: usize,
    /// N / (first start → the last saga's `finished_at`), sagas/s.
    rate: f64,
    /// N / (first start → the poll that saw the last saga terminal), sagas/s.
    rate_by_poll: f64,
    /// First start → last transaction of the burst committed, ms.
    burst_ms: f64,
    /// First start → the last saga's `finished_at`, ms.
    makespan_ms: f64,
    latency_p50: f64,
    latency_p99: f64,
    end_to_end_p50: f64,
    end_to_end_p99: f64,
    /// VmHWM when the last saga was done, MiB.
    peak_rss_mib: f64,
    /// VmRSS then, MiB.
    rss_mib: f64,
    db_size_mib: f64,
    /// Relay deliveries, and their enqueue → delivered latency (histogram bounds).
    delivered: u64,
    relay_p50_ms: Option<u64>,
    relay_p99_ms: Option<u64>,
}

/// Runs the `scale` bench on the chosen backends.
pub(crate) async fn run(args: &Args, scratch: &mut Scratch) -> anyhow::Result<Report> {
    let mut sizes = if !args.sizes.is_empty() {
        args.sizes.clone()
    } else if args.common.quick {
        QUICK_SIZES.to_vec()
    } else {
        FULL_SIZES.to_vec()
    };
    ensure!(
        sizes.iter().all(|&n| n > 0),
        "--sizes must all be at least 1"
    );
    sizes.sort_unstable();
    sizes.dedup();
    let started = Instant::now();
    let mut report = Report::default();
    for backend in args.common.backend.backends() {
        let name = backend.name();
        report.notes.push(scratch.describe(backend).await?);
        let mut outcomes: Vec<Outcome> = Vec::new();
        for &n in &sizes {
            let url = scratch.fresh_url(backend).await?;
            let outcome = child_run(backend, &url, n)
                .await
                .with_context(|| format!("{name} N = {n}"))?;
            eprintln!(
                "{name:<8} N {n:>6}  rate {:>7.1} sagas/s (by poll {:.1})  burst {:.0} ms  \
                 makespan {:.0} ms  p99 {:.0} ms (end to end {:.0} ms)  peak RSS {:.1} MiB  \
                 db {:.1} MiB  completed {}/{n}",
                outcome.rate,
                outcome.rate_by_poll,
                outcome.burst_ms,
                outcome.makespan_ms,
                outcome.latency_p99,
                outcome.end_to_end_p99,
                outcome.peak_rss_mib,
                outcome.db_size_mib,
                outcome.completed,
            );
            let share = outcome.completed as f64 / n as f64;
            let mut completed =
                Figure::new(BENCH, name, metric("completed_share", n), share, "share")
                    .target(Target::AtLeast(1.0));
            // Unrounded: 63,999 of 64,000 must not show as 1.0.
            completed.value = share;
            report.figures.extend([
                Figure::new(BENCH, name, metric("rate", n), outcome.rate, "sagas/s"),
                completed,
                Figure::new(
                    BENCH,
                    name,
                    metric("p99_latency", n),
                    outcome.latency_p99,
                    "ms",
                ),
                Figure::new(
                    BENCH,
                    name,
                    metric("p99_latency_end_to_end", n),
                    outcome.end_to_end_p99,
                    "ms",
                ),
                Figure::new(
                    BENCH,
                    name,
                    metric("peak_rss", n),
                    outcome.peak_rss_mib,
                    "MiB",
                ),
                Figure::new(
                    BENCH,
                    name,
                    metric("db_size", n),
                    outcome.db_size_mib,
                    "MiB",
                ),
            ]);
            outcomes.push(outcome);
        }
        if let (Some(small), Some(large)) = (outcomes.first(), outcomes.last())
            && outcomes.len() > 1
        {
            let ratio =
                |metric: &'static str, value: f64| Figure::new(BENCH, name, metric, value, "ratio");
            let rss = large.peak_rss_mib / small.peak_rss_mib;
            report.figures.extend([
                ratio("rate_ratio_largest_smallest", large.rate / small.rate)
                    .target(Target::AtLeast(RATE_RATIO_TARGET)),
                ratio("rss_ratio_largest_smallest", rss).target(Target::AtMost(RSS_RATIO_TARGET)),
            ]);
        }
        let detail: Vec<String> = outcomes
            .iter()
            .map(|o| {
                format!(
                    "N={}: burst committed in {:.0} ms, makespan {:.1} s, p50 {:.0} ms \
                     (end to end {:.0} ms), RSS at the end {:.1} MiB, {} relay deliveries \
                     (enqueue -> delivered p50 <= {} ms, p99 <= {} ms)",
                    o.sagas,
                    o.burst_ms,
                    o.makespan_ms / 1000.0,
                    o.latency_p50,
                    o.end_to_end_p50,
                    o.rss_mib,
                    o.delivered,
                    o.relay_p50_ms.map_or("?".into(), |v| v.to_string()),
                    o.relay_p99_ms.map_or("?".into(), |v| v.to_string()),
                )
            })
            .collect();
        report
            .notes
            .push(format!("{name} per N: {}", detail.join("; ")));
    }
    report.notes.extend([
        format!(
            "sagas: trip-shaped (reserve_flight; reserve_hotel + reserve_car in parallel; \
             charge_payment, the pivot; send_confirmation), {} s step timeouts and the \
             example's retry policy, five Agents that write nothing of their own, nothing \
             failing; all N started as one burst with start_saga_in, {START_CHUNK} per \
             transaction, one transaction after the other",
            STEP_TIMEOUT.as_secs()
        ),
        format!(
            "runtime: Runtime::builder() defaults, nothing overridden (admission: at most \
             {DEFAULT_MAX_IN_FLIGHT} sagas in flight, the rest wait in saga_starts); each N \
             in its own process (the hidden scale-child) on a fresh database"
        ),
        format!(
            "rate = N / (first start -> the last saga's finished_at); the end is detected \
             by counting sagas by state every {} ms (and no start waiting); p99_latency = \
             finished_at - created_at (from admission; on postgres both are transaction \
             start times); end_to_end from the commit of the \
             start transaction (with the wait in saga_starts, so it grows with N by design); \
             peak_rss = the child's VmHWM when the last saga is done; db_size = SQLite file \
             + WAL, or pg_database_size, then",
            POLL.as_millis()
        ),
        format!(
            "whole run: {:.1} s; targets: completed share 1.0 at every N, rate at the largest \
             N >= {RATE_RATIO_TARGET} x rate at the smallest, peak RSS at the largest <= \
             {RSS_RATIO_TARGET} x at the smallest{}",
            started.elapsed().as_secs_f64(),
            if args.common.quick {
                " (--quick: a smoke run, not a measurement)"
            } else {
                ""
            }
        ),
    ]);
    Ok(report)
}

/// How long the sagas of a burst of `n` may take to finish.
fn patience(n: usize) -> Duration {
    PATIENCE.max(PATIENCE_PER_SAGA * u32::try_from(n).unwrap_or(u32::MAX))
}

/// `name_n{n}`, leaked: a handful per run.
pub(crate) fn metric(name: &str, n: usize) -> &'static str {
    Box::leak(format!("{name}_n{n}").into_boxed_str())
}

/// Runs one burst in a `scale-child` process and reads its outcome.
async fn child_run(backend: Backend, url: &str, n: usize) -> anyhow::Result<Outcome> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut child = tokio::process::Command::new(exe)
        .arg("scale-child")
        .arg("--backend")
        .arg(backend.name())
        .arg("--url")
        .arg(url)
        .arg("--sagas")
        .arg(n.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting scale-child")?;
    let stdout = child.stdout.take().context("no stdout from scale-child")?;
    let mut lines = BufReader::new(stdout).lines();
    // The child bounds its own wait; this is only against a hung child.
    let patience = patience(n) + PATIENCE;
    let read = async {
        let mut last = None;
        while let Some(line) = lines.next_line().await? {
            if line.starts_with('{') {
                last = Some(line);
            }
        }
        anyhow::Ok(last)
    };
    let line = tokio::time::timeout(patience, read)
        .await
        .context("scale-child did not finish in time")??;
    let status = child.wait().await?;
    ensure!(status.success(), "scale-child failed: {status}");
    let line = line.context("scale-child printed no outcome")?;
    serde_json::from_str(&line).with_context(|| format!("reading {line}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patience_grows_with_n() {
        assert_eq!(patience(1_000), PATIENCE);
        assert_eq!(patience(64_000), Duration::from_secs(2_560));
    }

    #[test]
    fn metric_names() {
        assert_eq!(metric("rate", 64_000), "rate_n64000");
    }
}
