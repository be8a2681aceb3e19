//! What every bench takes: the database(s) to measure, a smoke run, the runtime's
//! shape.

use clap::ValueEnum;

use crate::db;

/// Options every bench takes.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Common {
    /// Which database(s) to measure.
    #[arg(long, value_enum, default_value_t = BackendChoice::Both)]
    pub(crate) backend: BackendChoice,
    /// Smaller sizes and a single round: a smoke run, not a measurement.
    #[arg(long)]
    pub(crate) quick: bool,
    /// The runtime (`saga`, `agents`) sends every agent's answer through the outbox
    /// (`answers_in_agent_transaction(false)`) instead of applying it to its saga in the
    /// agent's transaction: the runtime's shape before 2026-11-23, for comparison.
    #[arg(long)]
    pub(crate) answers_via_outbox: bool,
}

/// The `--backend` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendChoice {
    /// SQLite only.
    Sqlite,
    /// PostgreSQL only.
    Postgres,
    /// SQLite, then PostgreSQL.
    Both,
}

impl BackendChoice {
    /// The backends to run, in order.
    pub(crate) fn backends(self) -> Vec<db::Backend> {
        match self {
            Self::Sqlite => vec![db::Backend::Sqlite],
            Self::Postgres => vec![db::Backend::Postgres],
            Self::Both => vec![db::Backend::Sqlite, db::Backend::Postgres],
        }
    }
}

/// The `--transport` values: where the agents of a bench run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TransportChoice {
    /// Beside the orchestrator, in its process and database.
    InProcess,
    /// In another service, across NATS JetStream.
    Nats,
}
