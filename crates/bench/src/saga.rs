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
//! in one `Store::begin` (on SQLite a turn in the shared transaction of the hops
//! running, when they run; on PostgreSQL a transaction of its own); the floor writes its start rows one statement at a time.
//!
//! The floor writes, per saga, the rows the runtime writes, in the same transactions:
//! the start (instance + first step row + its command in the outbox, 50 sagas per
//! transaction); per agent delivery an inbox row + the reply in the outbox; per
//! orchestrator delivery an inbox row + the instance and step updates + the next
//! command (or compensation) in the outbox. It hands messages from one transaction to
//! the next through an in-memory queue worked by 8 tasks (the relay's 8 workers): no
//! relay, so no claims and no acknowledgements, and no reads of the saga back.
//!
//! Here the driver: the arguments, the runs of both sides and the report. The settings
//! are in [`setup`], the driving of a run in [`drive`], the runtime side in
//! [`runtime_side`], the floor in [`floor`].

mod drive;
mod figure;
mod floor;
mod nested;
mod remote;
mod runtime_side;
mod setup;
mod sleeps;

use std::time::Instant;

use anyhow::{Context, ensure};

use crate::common::Common;
use crate::db::{Backend, Scratch};
use crate::report::percentile;
use crate::report::{Figure, Report, Target};

pub(crate) use remote::{ChildArgs, check_nats_server, child, nats_server};
pub(crate) use sleeps::{ChildArgs as SleepsChildArgs, child as sleeps_child};

use drive::{POLL, START_BATCH, WINDOW};
use figure::figure;
use setup::{BENCH, FAIL_EVERY, PHYSICAL_BATCH, Scenario, Sizes};

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
    /// Where the agents run: `in-process` (the runtime's own agents, against the
    /// hand-written floors) or `nats` (in a second process with its own SQLite
    /// database, across a throwaway NATS JetStream server; the figures then stand
    /// against the in-process runtime's, run in alternation).
    #[arg(long, value_enum, default_value_t = crate::common::TransportChoice::InProcess)]
    transport: crate::common::TransportChoice,
    /// Which shapes to run (comma-separated): `happy`, `compensating`, `nested`. All
    /// three by default; one alone is for profiling a shape (`perf`, CPU per saga).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Shape::Happy, Shape::Compensating, Shape::Nested])]
    shapes: Vec<Shape>,
}

/// The `--shapes` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Shape {
    Happy,
    Compensating,
    Nested,
    /// Sagas asleep (RSS), and wake-ups due at once (lateness, the happy rate while
    /// they fire): not in the default run.
    Sleeps,
}

/// The `--sqlite-synchronous` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SqliteSync {
    Normal,
    Full,
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
    if args.transport == crate::common::TransportChoice::Nats {
        return over_nats(args, sizes, scratch).await;
    }
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
            let shape = match scenario {
                Scenario::Happy => Shape::Happy,
                Scenario::Compensating => Shape::Compensating,
            };
            if !args.shapes.contains(&shape) {
                continue;
            }
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
        if args.shapes.contains(&Shape::Sleeps) {
            let (figures, notes) = sleeps::figures(backend, args.common.quick, scratch).await?;
            report.figures.extend(figures);
            report.notes.extend(notes);
        }
        if args.shapes.contains(&Shape::Nested) {
            let (nested, note) =
                nested::figure(backend, sizes, args.workers, scratch, flat_happy).await?;
            report.figures.push(nested);
            report.notes.push(note);
        }
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
             the runtime with one `start_sagas_in` per `Store::begin` (on SQLite a turn \
             in the hops' shared transaction while they run), the floor a row at a time); \
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

/// `--transport nats`: per backend and scenario, the rate and latency over NATS
/// against the in-process runtime's.
async fn over_nats(args: &Args, sizes: Sizes, scratch: &mut Scratch) -> anyhow::Result<Report> {
    remote::check_nats_server()?;
    let started = Instant::now();
    let mut report = Report::default();
    for backend in args.common.backend.backends() {
        let name = backend.name();
        report.notes.push(scratch.describe(backend).await?);
        for scenario in [Scenario::Happy, Scenario::Compensating] {
            let (local, nats) = remote::figure(backend, scenario, sizes, args.workers, scratch)
                .await
                .with_context(|| format!("{name} {} over nats", scenario.name()))?;
            let [rate, p50, p99] = match scenario {
                Scenario::Happy => [
                    "nats_happy_rate",
                    "nats_happy_latency_p50",
                    "nats_happy_latency_p99",
                ],
                Scenario::Compensating => [
                    "nats_compensating_rate",
                    "nats_compensating_latency_p50",
                    "nats_compensating_latency_p99",
                ],
            };
            report
                .figures
                .push(Figure::new(BENCH, name, rate, nats.rate, "sagas/s").with_floor(local.rate));
            for (metric, p) in [(p50, 50.0), (p99, 99.0)] {
                report.figures.push(
                    Figure::new(BENCH, name, metric, percentile(&nats.latencies, p), "ms")
                        .with_floor(percentile(&local.latencies, p)),
                );
            }
        }
    }
    let rounds = if sizes.rounds == 1 {
        "one run per side and scenario (--quick: a smoke run, not a measurement)".to_owned()
    } else {
        format!(
            "median of {} runs per side and scenario (latency percentiles over the sagas \
             of all of them), in-process and nats alternating which goes first",
            sizes.rounds
        )
    };
    report.notes.extend([
        format!(
            "over nats: the orchestrator (this process, the backend above) sends agent_a, \
             agent_b and agent_c to a second process (this binary as `saga-agents-child`, \
             its own SQLite database, Runtime::builder() defaults with {} relay workers) \
             through a throwaway `nats-server -js` (file store on the temp dir, fresh per \
             run): every command and reply is an outbox row, a JetStream publish with its \
             ack, a durable consumer's fetch, a row in the other outbox, then its local \
             delivery; the floor of each figure is the runtime with the agents in-process \
             (the default bench's runtime side; answers applied in the agent's \
             transaction, which a remote agent cannot do)",
            args.workers
        ),
        format!(
            "sagas: {} per run, the default bench's shape, start window and pacing; {rounds}",
            sizes.sagas
        ),
        format!(
            "whole run: {:.1} s; ratio = value / floor (rates: higher is better; \
             latencies: lower is better)",
            started.elapsed().as_secs_f64()
        ),
    ]);
    Ok(report)
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
