//! `agentsaga-bench`: throughput benchmarks of agentsaga, each figure set against a
//! *floor*: the same work written by hand in plain sqlx, on the same kind of database,
//! with the same migrations and the same concurrency.
//!
//! ```text
//! cargo run --release -p agentsaga-bench -- outbox [--backend sqlite|postgres|both] [--quick]
//! cargo run --release -p agentsaga-bench -- relay  [--backend …] [--quick] [--workers 8] [--transport nats]
//! cargo run --release -p agentsaga-bench -- saga   [--backend …] [--quick] [--workers 8] [--transport nats]
//! cargo run --release -p agentsaga-bench -- agents [--backend …] [--quick] [--sagas 500] [--call-ms 500]
//! cargo run --release -p agentsaga-bench -- scale  [--backend …] [--quick] [--sizes 1000,4000]
//! ```
//!
//! # Benches
//!
//! - `outbox` ([`outbox`]): `enqueue_single_rate` (one message per transaction),
//!   `enqueue_batch100_rate` (100 messages per transaction) and `drain_rate` (claim 100,
//!   mark delivered, over a keyed backlog), each on SQLite (a temp-file database, WAL,
//!   `synchronous = NORMAL`, the store's default) and PostgreSQL.
//! - `relay` ([`relay`]): `drain_rate` of a relay to a no-op transport against a
//!   hand-written claim/ack loop; commit → delivery latency percentiles at 1,000 msgs/s,
//!   in-process and, on PostgreSQL, across two processes (the hidden `relay-child`
//!   subcommand is the second process). `--transport nats`: `nats_publish_rate`, a
//!   relay publishing to NATS JetStream against plain `async-nats` publishes with acks.
//! - `saga` ([`saga`]): 3-step no-op sagas per second through the runtime, happy and
//!   20 % compensating, and their start → terminal latency, against the same
//!   transactions written by hand. `--transport nats`: the same sagas with the agents
//!   in a second process (the hidden `saga-agents-child`) across NATS JetStream,
//!   against the runtime with its agents in-process.
//! - `agents` ([`agents`]): 500 sagas of 3 steps, each step a `CallingAgent` whose call
//!   sleeps 500 ms, all started at once on the runtime's defaults: the `makespan` (first
//!   start → last saga completed) against the critical path (3 × 500 ms), the sagas
//!   `completed` (all, or the bench fails), and their latency.
//! - `scale` ([`scale`]): one burst of N trip-shaped sagas (N = 1,000 … 64,000) on the
//!   runtime's defaults, each N in a fresh process (the hidden `scale-child`) on a fresh
//!   database: rate, completed share, p99 latency, peak RSS and database size per N, and
//!   how rate and RSS change from the smallest N to the largest (units `share`, `MiB`,
//!   `ratio` besides the others).
//!
//! PostgreSQL is a throwaway server started by `agentsaga_core::testing` (it runs with
//! `fsync = off`, `synchronous_commit = off` and `full_page_writes = off`: commits cost
//! no disk flush), unless `AGENTSAGA_BENCH_PG_URL` names a server to use instead (its
//! role must be allowed to create databases; the bench creates and drops its own).
//!
//! # Output contract
//!
//! stdout carries first a human table (a header, one row per figure, notes on the
//! setup), then, for machines, one JSON object per line, one per figure:
//!
//! ```json
//! {"bench":"outbox","backend":"sqlite","metric":"drain_rate","value":51234.5,"unit":"msgs/s","floor":60321.0,"ratio":0.849}
//! ```
//!
//! `floor` and `ratio` (= `value / floor`; higher is better for rates, lower for
//! latencies) are present only where a floor exists; one exception, the `agents`
//! bench's `makespan`, whose floor is the critical path and whose ratio is
//! `floor / value` (the issue's "ideal / makespan": higher is better, 1 is perfect).
//! Units are `msgs/s`, `sagas/s`, `ms` or `sagas` (a count). The table's last column
//! shows the issue's targets and whether they are met (targets are not in the JSON).
//! Machine readers take the lines that start with `{`.
//! Progress and per-round figures go to stderr.

mod agents;
mod common;
mod cpu;
mod db;
mod outbox;
mod quick;
mod relay;
mod report;
mod saga;
mod scale;
mod status;

use clap::{Parser, Subcommand};

/// mimalloc, not glibc's malloc: on the saga bench glibc's allocator (its arena locks,
/// `malloc_consolidate`) took about a quarter of the process's CPU, and a multi-threaded
/// allocator is what a deployed orchestrator binary should use too. Runtime and floors
/// share it, so the ratios compare like with like.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Benchmarks of agentsaga against hand-written sqlx floors.
#[derive(Debug, Parser)]
#[command(name = "agentsaga-bench", version)]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

/// One subcommand per bench.
#[derive(Debug, Subcommand)]
enum Bench {
    /// Outbox throughput: enqueue one, enqueue 100, drain a keyed backlog.
    Outbox(outbox::Args),
    /// The relay: drain rate to a no-op transport; commit-to-delivery latency at
    /// 1,000 msgs/s, in-process and (PostgreSQL) across two processes.
    Relay(relay::Args),
    /// Sagas: 3-step no-op sagas per second, happy and 20 % compensating, and their
    /// latency.
    Saga(saga::Args),
    /// Calling agents: 500 sagas of 3 steps that each wait 500 ms on the outside world,
    /// all at once, on the default settings: makespan against the critical path.
    Agents(agents::Args),
    /// Scale: one burst of N trip-shaped sagas (1,000 to 64,000) on the defaults, each
    /// N in a fresh process and database: rate, p99 latency, peak RSS, database size.
    Scale(scale::Args),
    /// The console's overview (`Console::status`) against 1,000,000 finished sagas:
    /// the first call, the median and the slowest of the next (target: 50 ms).
    Status(status::Args),
    /// Internal: the relay process of the cross-process latency run.
    #[command(hide = true)]
    RelayChild(relay::ChildArgs),
    /// Internal: the agents' service of `saga --transport nats`.
    #[command(hide = true)]
    SagaAgentsChild(saga::ChildArgs),
    /// Internal: one burst of the scale bench, in its own process.
    #[command(hide = true)]
    ScaleChild(scale::ChildArgs),
    /// Internal: the saga bench's sagas asleep, in their own process.
    #[command(hide = true)]
    SleepsChild(saga::SleepsChildArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Bench::RelayChild(args) = &cli.bench {
        return relay::child(args).await;
    }
    if let Bench::ScaleChild(args) = &cli.bench {
        return scale::child(args).await;
    }
    if let Bench::SagaAgentsChild(args) = &cli.bench {
        return saga::child(args).await;
    }
    if let Bench::SleepsChild(args) = &cli.bench {
        return saga::sleeps_child(args).await;
    }
    let mut scratch = db::Scratch::new();
    let result = match &cli.bench {
        Bench::Outbox(args) => outbox::run(args, &mut scratch).await,
        Bench::Relay(args) => relay::run(args, &mut scratch).await,
        Bench::Saga(args) => saga::run(args, &mut scratch).await,
        Bench::Agents(args) => agents::run(args, &mut scratch).await,
        Bench::Scale(args) => scale::run(args, &mut scratch).await,
        Bench::Status(args) => status::run(args, &mut scratch).await,
        Bench::RelayChild(_)
        | Bench::ScaleChild(_)
        | Bench::SagaAgentsChild(_)
        | Bench::SleepsChild(_) => {
            unreachable!("handled above")
        }
    };
    scratch.cleanup().await;
    let mut report = result?;
    report.notes.push(
        "allocator: mimalloc (the bench binary's global allocator, for runtime and floors alike)"
            .to_owned(),
    );
    report.print();
    Ok(())
}
