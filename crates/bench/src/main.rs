//! `agentsaga-bench`: throughput benchmarks of agentsaga, each figure set against a
//! *floor*: the same work written by hand in plain sqlx, on the same kind of database,
//! with the same migrations and the same concurrency.
//!
//! ```text
//! cargo run --release -p agentsaga-bench -- outbox [--backend sqlite|postgres|both] [--quick]
//! ```
//!
//! # Benches
//!
//! - `outbox` ([`outbox`]): `enqueue_single_rate` (one message per transaction),
//!   `enqueue_batch100_rate` (100 messages per transaction) and `drain_rate` (claim 100,
//!   mark delivered, over a keyed backlog), each on SQLite (a temp-file database, WAL,
//!   `synchronous = NORMAL`, the store's default) and PostgreSQL.
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
//! `floor` and `ratio` (= `value / floor`; higher is better for rates) are present
//! only where a floor exists. Machine readers take the lines that start with `{`.
//! Progress and per-round figures go to stderr.

mod db;
mod outbox;
mod report;

use clap::{Parser, Subcommand, ValueEnum};

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
}

/// Options every bench takes.
#[derive(Debug, Clone, clap::Args)]
struct Common {
    /// Which database(s) to measure.
    #[arg(long, value_enum, default_value_t = BackendChoice::Both)]
    backend: BackendChoice,
    /// Smaller sizes and a single round: a smoke run, not a measurement.
    #[arg(long)]
    quick: bool,
}

/// The `--backend` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendChoice {
    /// SQLite only.
    Sqlite,
    /// PostgreSQL only.
    Postgres,
    /// SQLite, then PostgreSQL.
    Both,
}

impl BackendChoice {
    /// The backends to run, in order.
    fn backends(self) -> Vec<db::Backend> {
        match self {
            Self::Sqlite => vec![db::Backend::Sqlite],
            Self::Postgres => vec![db::Backend::Postgres],
            Self::Both => vec![db::Backend::Sqlite, db::Backend::Postgres],
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut scratch = db::Scratch::new();
    let result = match &cli.bench {
        Bench::Outbox(args) => outbox::run(args, &mut scratch).await,
    };
    scratch.cleanup().await;
    let report = result?;
    report.print();
    Ok(())
}
