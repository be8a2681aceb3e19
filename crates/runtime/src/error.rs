//! The errors of `agentsaga-runtime`.

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong building, starting or using a runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The builder was not given what it needs.
    #[error("runtime configuration: {0}")]
    Config(String),

    /// The store failed (open, migrate, a transaction).
    #[error(transparent)]
    Store(#[from] agentsaga_core::Error),

    /// The saga engine refused (unknown saga name, bad data...).
    #[error(transparent)]
    Saga(#[from] agentsaga_saga::Error),

    /// The relay could not start.
    #[error(transparent)]
    Relay(#[from] agentsaga_relay::Error),

    /// Another runtime runs on this SQLite file (in this process or another). SQLite
    /// serves one process; several processes share the work on PostgreSQL.
    #[error(
        "another runtime{} runs on the SQLite database {}: SQLite serves one process \
         (a second would degrade without a word); use PostgreSQL (postgres://…) for \
         several processes sharing the work",
        holder.map(|p| format!(" (process {p})")).unwrap_or_default(),
        path.display()
    )]
    SqliteInUse {
        /// The database file.
        path: std::path::PathBuf,
        /// The process id the lock file names, if it could be read.
        holder: Option<u32>,
    },

    /// (feature `nats`) The NATS link could not be set up: the server unreachable, the
    /// stream or a consumer refused.
    #[cfg(feature = "nats")]
    #[error(transparent)]
    Remote(#[from] agentsaga_relay::nats::NatsError),

    /// (feature `testing`) The runtime under test did not come to rest, or a saga did
    /// not end, as [`TestRuntime`](crate::testing::TestRuntime) waited for it: what was
    /// still going on.
    #[cfg(feature = "testing")]
    #[error("the runtime under test is not at rest: {0}")]
    NotAtRest(String),

    /// (feature `testing`) A saga under test broke one of the promises of
    /// `docs/guarantees.md` ([`TestRuntime::check_promises`], [`RandomFaults`]): what
    /// broke, and under random faults the seed that shows it and how to run it again.
    ///
    /// [`TestRuntime::check_promises`]: crate::testing::TestRuntime::check_promises
    /// [`RandomFaults`]: crate::testing::RandomFaults
    #[cfg(feature = "testing")]
    #[error("a promise broke: {0}")]
    PromiseBroken(String),

    /// (feature `testing`) A recorded agent was asked for a call its recording does
    /// not hold ([`Recording`](crate::testing::Recording)): the step, its key, the file.
    #[cfg(feature = "testing")]
    #[error("{0}")]
    NotRecorded(String),

    /// An actor could not be spawned.
    #[error("could not spawn an actor: {0}")]
    Spawn(String),
}

impl Error {
    /// Is this [`Runtime::try_start_saga`](crate::Runtime::try_start_saga)'s "busy: the
    /// saga name is at its admission bound"?
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Saga(agentsaga_saga::Error::Busy { .. }))
    }
}
