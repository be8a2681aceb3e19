//! The errors of `agentsaga-core`.

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the store, the outbox and the inbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database URL could not be understood: unknown scheme or malformed options.
    #[error("invalid database url `{}`: {reason}", crate::redact_url(url))]
    InvalidUrl {
        /// The URL as given (printed with its passwords as `***`).
        url: String,
        /// Why it was refused.
        reason: String,
    },

    /// The database could not be opened or reached.
    #[error("cannot open the {scheme} database: {source}")]
    Connect {
        /// `sqlite` or `postgres`.
        scheme: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },

    /// The database was migrated by a newer agentsaga than this binary; using it
    /// half-understood could corrupt it, so it is refused.
    #[error(
        "the database schema is at version {found}, newer than this binary understands \
         (up to {known}): upgrade agentsaga before opening it"
    )]
    SchemaTooNew {
        /// The newest migration applied to the database.
        found: i64,
        /// The newest migration this binary embeds.
        known: i64,
    },

    /// Applying the embedded migrations failed.
    #[error("migrating the database failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),

    /// The message's destination is empty.
    #[error("a message needs a destination; it was empty")]
    EmptyDestination,

    /// The message (payload and headers) is bigger than the store accepts.
    #[error("message of {size} bytes is over the limit of {limit} bytes")]
    PayloadTooLarge {
        /// Size of the payload and headers, in bytes.
        size: usize,
        /// The configured limit.
        limit: usize,
    },

    /// Backpressure: the outbox already holds its maximum of pending rows. Nothing was
    /// written; try again later.
    #[error("the outbox is full: {pending} pending messages, limit {limit}")]
    QueueFull {
        /// Pending rows counted (up to the limit).
        pending: u64,
        /// The configured limit.
        limit: u64,
    },

    /// A value could not be turned into JSON, or JSON back into a value.
    #[error("JSON encoding or decoding failed: {0}")]
    Json(#[from] serde_json::Error),

    /// A connection of one backend was handed to a store of the other.
    #[error("this store is {store}, but the connection given is {connection}")]
    BackendMismatch {
        /// The store's backend.
        store: &'static str,
        /// The connection's backend.
        connection: &'static str,
    },

    /// No row with this id in the state the operation needs.
    #[error("{what} `{id}` not found")]
    NotFound {
        /// What was looked for, e.g. "dead letter".
        what: &'static str,
        /// The id looked for.
        id: String,
    },

    /// A row read back from the database is not what this binary wrote.
    #[error("corrupt row in `{table}`: {reason}")]
    Corrupt {
        /// The table.
        table: &'static str,
        /// What was wrong.
        reason: String,
    },

    /// The shared transaction a hop ran in (see [`Store::hop`](crate::Store::hop))
    /// could not be begun or committed: nothing of the hop was written. Transient.
    #[error("shared transaction: {0}")]
    SharedCommit(String),

    /// Any other database error.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl Error {
    /// True for errors that may go away by themselves (the database unreachable, a
    /// pool timeout, a serialization failure): worth retrying with backoff.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::QueueFull { .. } | Error::SharedCommit(_) => true,
            Error::Database(e) => match e {
                sqlx::Error::Io(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::Tls(_)
                | sqlx::Error::Protocol(_)
                | sqlx::Error::WorkerCrashed => true,
                sqlx::Error::Database(db) => {
                    // 40001 serialization_failure, 40P01 deadlock, 57P01 admin shutdown,
                    // 08xxx connection exceptions; SQLite BUSY / LOCKED.
                    let code = db.code().unwrap_or_default();
                    code == "40001"
                        || code == "40P01"
                        || code.starts_with("57P")
                        || code.starts_with("08")
                        || code == "5"
                        || code == "6"
                        || code == "517"
                }
                _ => false,
            },
            _ => false,
        }
    }
}
