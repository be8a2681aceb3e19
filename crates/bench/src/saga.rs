//! The `saga` bench: 3-step no-op sagas run by [`agentsaga_runtime::Runtime`], against
//! the same transactions written by hand in plain sqlx (the *floor*).
//!
//! The saga: `step_a` (agent `agent_a`, compensation to `agent_a`), `step_b` (likewise),
//! `step_c` (agent `agent_c`, the pivot). The agents do nothing but answer; `agent_c`
//! fails fatally when the saga data says `fail`, which sends the saga back through the
//! compensations of `step_b` then `step_a`.
//!
//! - `happy_rate`: N sagas, none failing, in sagas/s (N / time from the first start to
//!   the last saga terminal).
//! - `compensating_rate`: the same with every 5th saga failing at `step_c` (20 %).
//! - `*_latency_p50` / `*_latency_p99`: per saga, `updated_at - created_at` of its
//!   `saga_instances` row (start transaction → terminal transaction, ms resolution),
//!   over the same runs.
//!
//! Both sides are driven alike: sagas are started 50 per transaction (like the
//! `trip_booking` example), a new batch whenever at most 150 are unfinished (so at most
//! 200 in flight), until N are started; then the driver waits for the last. The
//! runtime starts each batch with one `Runtime::start_sagas_in` (multi-row statements)
//! in a hop (`Store::hop`: on SQLite a turn in the shared transaction of the hops
//! running, as its docs advise for writes under load; on PostgreSQL a transaction of
//! its own); the floor writes its start rows one statement at a time.
//!
//! The floor writes, per saga, the rows the runtime writes, in the same transactions:
//! the start (instance + first step row + its command in the outbox, 50 sagas per
//! transaction); per agent delivery an inbox row + the reply in the outbox; per
//! orchestrator delivery an inbox row + the instance and step updates + the next
//! command (or compensation) in the outbox. It hands messages from one transaction to
//! the next through an in-memory queue worked by 8 tasks (the relay's 8 workers): no
//! relay, so no claims and no acknowledgements, and no reads of the saga back.
//!
//! Here the driver: the arguments, the runs of both sides and the report. The runtime
//! side is in [`runtime_side`], the floor in [`floor`].

mod figure;
mod floor;
mod nested;
mod runtime_side;

use figure::figure;

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

use crate::common::Common;
use crate::db::{Backend, Scratch};
use crate::outbox::{self, Plain};
use crate::report::percentile;
use crate::report::{Figure, Report, Target};

const BENCH: &str = "saga";
const SAGA: &str = "bench";
/// `saga.<name>.v<version>`: where replies go.
const ORCHESTRATOR: &str = "saga.bench.v1";
/// (step name, agent destination), in order; the last is the pivot.
const STEPS: [(&str, &str); 3] = [
    ("step_a", "agent_a"),
    ("step_b", "agent_b"),
    ("step_c", "agent_c"),
];
/// Sagas per start transaction.
const START_BATCH: usize = 50;
/// At most this many sagas unfinished.
const WINDOW: usize = 200;
/// 1 in this many sagas fails at `step_c` in the compensating runs.
const FAIL_EVERY: u64 = 5;
/// How often the driver looks at the unfinished count.
const POLL: Duration = Duration::from_millis(10);
/// Targets from the issue.
const SQLITE_TARGET: f64 = 2_500.0;
const POSTGRES_TARGET: f64 = 1_500.0;
const RATIO_TARGET: f64 = 0.5;

/// `saga` options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: Common,
    /// The runtime relay's delivery workers (its default: 8), and the floor's tasks. A
    /// relay keeps up to workers + batch size rows in flight.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// SQLite's `synchronous` for both sides: `normal` (the store's default: durable
    /// across process crashes) or `full` (durable across power loss).
    #[arg(long, value_enum, default_value_t = SqliteSync::Normal)]
    sqlite_synchronous: SqliteSync,
    /// Runs the runtime side only (no floor, no physical reference): for iterating on
    /// the runtime; the figures then carry no floor and no ratio.
    #[arg(long)]
    runtime_only: bool,
}

/// The `--sqlite-synchronous` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SqliteSync {
    Normal,
    Full,
}

/// How much work each figure does.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Sagas per run.
    sagas: usize,
    /// Runs per side and scenario (the median is reported).
    rounds: usize,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                sagas: 300,
                rounds: 1,
            }
        } else {
            Self {
                sagas: 2_000,
                rounds: 2,
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Happy,
    Compensating,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Self::Happy => "happy",
            Self::Compensating => "compensating",
        }
    }

    fn fails(self, n: u64) -> bool {
        self == Self::Compensating && n.is_multiple_of(FAIL_EVERY)
    }
}

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

/// Hops per transaction of the physical reference.
const PHYSICAL_BATCH: usize = 100;

/// What one run measured.
#[derive(Debug, Clone)]
struct Run {
    rate: f64,
    /// Per-saga latencies, ms, sorted.
    latencies: Vec<f64>,
    /// The runtime's hops per shared commit (group commit).
    hops_per_commit: Option<f64>,
    /// The runtime's deliveries taken by direct handover, of all its deliveries.
    handed_share: Option<f64>,
}

/// Runs the `saga` bench on the chosen backends.
pub(crate) async fn run(args: &Args, scratch: &mut Scratch) -> anyhow::Result<Report> {
    ensure!(args.workers > 0, "--workers must be at least 1");
    crate::db::SQLITE_FULL_SYNC.store(
        args.sqlite_synchronous == SqliteSync::Full,
        std::sync::atomic::Ordering::Relaxed,
    );
    crate::db::ANSWERS_VIA_OUTBOX.store(
        args.common.answers_via_outbox,
        std::sync::atomic::Ordering::Relaxed,
    );
    let sizes = Sizes::new(args.common.quick);
    let started = Instant::now();
    let mut report = Report::default();
    report.notes.push(answers_note());
    for backend in args.common.backend.backends() {
        let name = backend.name();
        report.notes.push(scratch.describe(backend).await?);
        let absolute = match backend {
            Backend::Sqlite => SQLITE_TARGET,
            Backend::Postgres => POSTGRES_TARGET,
        };
        let mut flat_happy = 0.0;
        for scenario in [Scenario::Happy, Scenario::Compensating] {
            let (runtime, floor, batched, sets) = figure(
                backend,
                scenario,
                sizes,
                args.workers,
                args.runtime_only,
                scratch,
            )
            .await
            .with_context(|| format!("{name} {}", scenario.name()))?;
            if scenario == Scenario::Happy {
                flat_happy = runtime.rate;
            }
            let metric = |m: &str| -> &'static str {
                match (scenario, m) {
                    (Scenario::Happy, "rate") => "happy_rate",
                    (Scenario::Happy, "physical") => "happy_rate_vs_physical",
                    (Scenario::Compensating, "physical") => "compensating_rate_vs_physical",
                    (Scenario::Happy, "sets") => "happy_rate_vs_set_reference",
                    (Scenario::Compensating, "sets") => "compensating_rate_vs_set_reference",
                    (Scenario::Happy, "p50") => "happy_latency_p50",
                    (Scenario::Happy, _) => "happy_latency_p99",
                    (Scenario::Compensating, "rate") => "compensating_rate",
                    (Scenario::Compensating, "p50") => "compensating_latency_p50",
                    (Scenario::Compensating, _) => "compensating_latency_p99",
                }
            };
            // Without floor runs (`--runtime-only`) a figure has no floor and no ratio.
            let floored = |figure: Figure, floor: f64| {
                if args.runtime_only {
                    figure
                } else {
                    figure.with_floor(floor)
                }
            };
            let rate = floored(
                Figure::new(BENCH, name, metric("rate"), runtime.rate, "sagas/s"),
                floor.rate,
            )
            .target(Target::AtLeast(absolute));
            report.figures.push(if args.runtime_only {
                rate
            } else {
                rate.target(Target::Ratio(RATIO_TARGET))
            });
            if !args.runtime_only {
                report.figures.push(
                    Figure::new(BENCH, name, metric("physical"), runtime.rate, "sagas/s")
                        .with_floor(batched.rate),
                );
            }
            if let Some(sets) = &sets {
                report.figures.push(
                    Figure::new(BENCH, name, metric("sets"), runtime.rate, "sagas/s")
                        .with_floor(sets.rate),
                );
            }
            for (m, p) in [("p50", 50.0), ("p99", 99.0)] {
                let latency = percentile(&runtime.latencies, p);
                report.figures.push(floored(
                    Figure::new(BENCH, name, metric(m), latency, "ms"),
                    percentile(&floor.latencies, p),
                ));
            }
            report.notes.push(format!(
                "{name} {}: runtime {:.1} hops per shared commit, {:.0} % of deliveries by \
                 direct handover (no claim); the one-transaction-per-hop floor {:.0} sagas/s, \
                 the physical reference ({PHYSICAL_BATCH} hops per transaction) {:.0} sagas/s",
                scenario.name(),
                runtime.hops_per_commit.unwrap_or(0.0),
                runtime.handed_share.unwrap_or(0.0) * 100.0,
                floor.rate,
                batched.rate,
            ));
            if let Some(sets) = &sets {
                report.notes.push(format!(
                    "{name} {}: the set reference (the physical reference's transactions, \
                     one statement per kind of row for all their hops) {:.0} sagas/s",
                    scenario.name(),
                    sets.rate,
                ));
            }
        }
        let (nested, note) =
            nested::figure(backend, sizes, args.workers, scratch, flat_happy).await?;
        report.figures.push(nested);
        report.notes.push(note);
    }
    let rounds = if sizes.rounds == 1 {
        "one run per side and scenario (--quick: a smoke run, not a measurement)".to_owned()
    } else {
        format!(
            "median of {} runs per side and scenario (latency percentiles over the sagas \
             of all of them), runtime and floor alternating which goes first, each run in \
             a fresh database",
            sizes.rounds
        )
    };
    report.notes.extend([
        format!(
            "sagas: {} per run, 3 no-op steps (a, b with compensations; c the pivot); \
             compensating runs fail step c fatally for every {FAIL_EVERY}th saga (from the \
             saga data), which then compensates b and a. Started {START_BATCH} per \
             transaction whenever at most {} are unfinished ({WINDOW} in flight at most; \
             the runtime with one `start_sagas_in` per hop (`Store::hop`; on SQLite a turn \
             in the shared transaction, since 2026-11-26), the floor a row at a time); \
             rate = N / (first start -> last terminal, polled every {} ms); {rounds}",
            sizes.sagas,
            WINDOW - START_BATCH,
            POLL.as_millis()
        ),
        format!(
            "runtime: Runtime::builder() defaults ({} deliveries at once per agent, {} per \
             saga version; group commit: the hops ready at once share a transaction; direct \
             handover; relay batch 100, poll 250 ms) with at least {} relay workers; one \
             process, the store's own pool",
            agentsaga_runtime::DEFAULT_AGENT_CONCURRENCY,
            agentsaga_runtime::DEFAULT_ORCHESTRATOR_CONCURRENCY,
            args.workers,
        ),
        format!(
            "floor: the same row writes in the same transactions in plain sqlx (start: \
             instance + step row + command, {START_BATCH} sagas per transaction; agent: \
             inbox + reply; orchestrator: inbox + instance/step updates + next command or \
             compensation), {} tasks handing the messages on in memory: no \
             relay claims or acks, no saga loads, a failed step writes its reply without \
             the runtime's rollback-and-retry of the agent transaction. The physical \
             reference (`*_vs_physical`): the same writes, each task taking up to \
             {PHYSICAL_BATCH} ready hops into one transaction. The set reference \
             (`*_vs_set_reference`, postgres only): the physical reference's \
             transactions with each kind of row (instances, steps, inbox, outbox; inserts \
             and updates) written for all their hops in one `unnest` statement at the \
             commit: what the database does when hops are written as sets",
            args.workers
        ),
        "latency: updated_at - created_at of each saga (start transaction -> terminal \
         transaction, ms clock; on postgres transaction start times), under the run's own \
         load, so mostly queueing behind the other sagas in flight; its ratio is value / \
         floor too, so lower is better there"
            .to_owned(),
        format!(
            "whole run: {:.1} s; targets: sqlite >= {SQLITE_TARGET} sagas/s, postgres >= \
             {POSTGRES_TARGET} sagas/s, ratio >= {RATIO_TARGET}",
            started.elapsed().as_secs_f64()
        ),
    ]);
    Ok(report)
}

/// Starts sagas `START_BATCH` at a time while at most `WINDOW - START_BATCH` are
/// unfinished, until `n` are started and none is unfinished. `start(first, count)`
/// starts sagas `first..first + count` in one transaction; `unfinished(started)`
/// counts those not terminal. Returns the elapsed time.
async fn drive<S, SF, U, UF>(n: usize, mut start: S, mut unfinished: U) -> anyhow::Result<Duration>
where
    S: FnMut(usize, usize) -> SF,
    SF: Future<Output = anyhow::Result<()>>,
    U: FnMut(usize) -> UF,
    UF: Future<Output = anyhow::Result<usize>>,
{
    let begin = Instant::now();
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
            return Ok(begin.elapsed());
        }
        if Instant::now() > deadline {
            bail!("{open} sagas still unfinished after 10 minutes ({started} of {n} started)");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Checks the final states (every saga terminal, the expected number compensated) and
/// returns the sorted latencies, ms.
async fn check_and_measure(
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

/// How the runtime's agents answered their sagas in this run.
pub(crate) fn answers_note() -> String {
    if crate::db::answers_via_outbox() {
        "runtime answers: through the outbox (--answers-via-outbox: a reply row, its \
         delivery and an orchestrator hop per step)"
            .to_owned()
    } else {
        "runtime answers: applied to the saga in the agent's transaction (the default; \
         --answers-via-outbox sends them through the outbox)"
            .to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_in_five_fails_when_compensating() {
        let fails = (0..100)
            .filter(|&n| Scenario::Compensating.fails(n))
            .count();
        assert_eq!(fails, 20);
        assert!((0..100).all(|n| !Scenario::Happy.fails(n)));
    }
}
