//! The errors of `agentsaga-core`.

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the store, the outbox and the inbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database URL could not be understood: unknown scheme or malformed options.
    #[error("invalid database url `{}`: {reason}", crate::redact::redact_url(url))]
    InvalidUrl {
        /// The URL as given (printed with its passwords as `***`).
        url: String,
        /// Why it was refused.
        reason: String,
    },

    /// A manual clock (feature `testing`) was given to a store on a PostgreSQL database
    /// that agentsaga migrated without one: a database in use, whose rows keep the
    /// server's time. The clock is installed only in a fresh database (or one that has
    /// it already), so that a test pointed at a live database cannot put it on a
    /// test's clock.
    #[error(
        "a manual clock is installed only in a fresh PostgreSQL database (or one that has \
         it already): this one was migrated on the server's clock; give the test a \
         database of its own"
    )]
    ManualClockNeedsAFreshDatabase,

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

    /// The shared transaction a transaction ran in (a turn in SQLite's lane, see
    /// [`Store::begin`](crate::Store::begin)) could not be begun or committed: nothing
    /// of it was written. Transient.
    #[error("shared transaction: {0}")]
    SharedCommit(String),

    /// [`Store::begin`](crate::Store::begin) was called by a task that holds SQLite's
    /// writer already (a turn in the lane, an agent's handler say, or an earlier
    /// `begin` not yet committed), and still held it after
    /// [`StoreConfig::hop_timeout`](crate::StoreConfig::hop_timeout): the second waits
    /// for the first, which waits for it. Nothing was begun. Write in the transaction
    /// you hold (in a handler, `ctx.tx()`). (Two futures of one task that begin side by
    /// side, with `join!`, take turns: the second waits for the first to end.)
    #[error(
        "this task already holds a transaction of the store's lane: a second one would \
         wait for it forever; write in the transaction you hold (in a handler, ctx.tx())"
    )]
    NestedTransaction,

    /// The transaction could not be committed: a statement in it had failed (on
    /// PostgreSQL that aborts the whole transaction, even if its error was ignored), so
    /// its `COMMIT` rolled it back. Nothing of it was written, nothing was handed over
    /// or acknowledged. Run a statement whose failure you tolerate in a savepoint.
    #[error(
        "the transaction was rolled back, not committed: a statement in it had failed \
         (its error ignored?), which aborts a PostgreSQL transaction; nothing was written"
    )]
    RolledBack,

    /// An exclusive right ([`Store::try_exclusive`](crate::Store::try_exclusive)) could
    /// not be asked for: a name it cannot have, or its lock file cannot be opened.
    #[error("exclusive right `{name}`: {reason}")]
    Exclusive {
        /// The right's name.
        name: String,
        /// Why.
        reason: String,
    },

    /// A statement handed to `Tx::read` (the engine's reads in a hop) that names a
    /// write or a lock (it does not begin with `SELECT` or `WITH`, or names `INSERT`,
    /// `UPDATE`, `DELETE`, `MERGE` or a row lock): nothing was run. Run it through
    /// [`Tx::conn`](crate::Tx::conn).
    #[error("not a read (run it through Tx::conn): {0}")]
    NotARead(String),

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
                    let code = db.code().unwrap_or_default();
                    transient_code(&code)
                        // A concurrent producer of the key got its row in flight first
                        // (the claim met it): the claim is tried again.
                        || (code == "23505" && db.constraint() == Some("outbox_key_in_flight"))
                }
                _ => false,
            },
            _ => false,
        }
    }
}

/// The database's error codes that say "try again": PostgreSQL's SQLSTATEs and SQLite's
/// extended result codes (sqlx reports the extended code).
fn transient_code(code: &str) -> bool {
    match code {
        // PostgreSQL. Class 40, transaction rollback: 40000, 40001 serialization
        // failure, 40003 statement completion unknown, 40P01 deadlock (not 40002, an
        // integrity constraint).
        "40000" | "40001" | "40003" | "40P01" => true,
        // 55P03 lock_not_available (lock_timeout), 55006 object in use.
        "55P03" | "55006" => true,
        // 57014 query_canceled (statement_timeout), 57P01..57P05 shutdowns, crashes,
        // idle sessions ended.
        "57014" => true,
        c if c.starts_with("57P") => true,
        // Class 08, connection exceptions; class 53, insufficient resources (disk
        // full, out of memory, too many connections).
        c if c.starts_with("08") || c.starts_with("53") => true,
        // 58030 io_error.
        "58030" => true,
        // SQLite: BUSY (5) and its extended codes RECOVERY (261), SNAPSHOT (517),
        // TIMEOUT (773); LOCKED (6) and SHAREDCACHE (262), VTAB (518); PROTOCOL (15),
        // a lock race of WAL's.
        "5" | "261" | "517" | "773" | "6" | "262" | "518" | "15" => true,
        _ => false,
    }
}
