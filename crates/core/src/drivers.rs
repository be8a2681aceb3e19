//! The drivers of this build, named in this one file. Everything else in the crate
//! is written once, for any driver: it reaches a driver through the enums below and
//! the macros beside them (`on_backend!`, `on_conn!`, `on_tx!`, `on_reader!`), and
//! each driver implements the store's traits ([`Dialect`](crate::store::backend::Dialect)
//! for its statements, [`Driver`](crate::store::backend::Driver) for its transactions,
//! lanes and reads), so that the compiler keeps them in step.
//!
//! Each driver owns its backend in its folder: its database and pools, its
//! transaction ([`sqlite::held::SqliteTx`], [`postgres::pgtx::PgTx`]), its lane and the
//! requests that wait for it, its SQL (the cold path's statements, the hot path's
//! [`Writes`](crate::write::Writes) and [`Read`](crate::read::Read)s rendered), the
//! sqlx types of the crate's values, and its migrations.
//!
//! A third backend is (see `docs/ARCHITECTURE.md`, "Adding a backend"): a folder
//! beside these two, a variant in each enum and an arm in each macro of this file,
//! its migrations, and a feature in `Cargo.toml`.

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
compile_error!("agentsaga-core needs a backend: enable the `sqlite` or the `postgres` feature");

#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

use crate::store::config::StoreConfig;
use crate::store::wake::Wakeups;
use crate::{Error, Result};

/// The open database, of one driver or another.
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    #[cfg(feature = "sqlite")]
    Sqlite(sqlite::Sqlite),
    #[cfg(feature = "postgres")]
    Postgres(postgres::Postgres),
}

impl Backend {
    /// Opens the database at `url` with the driver its scheme names, and the wakeups
    /// of its relays (shared with other processes where the database is).
    pub(crate) async fn open(url: &str, config: &StoreConfig) -> Result<(Self, Wakeups)> {
        let scheme = url.split(':').next().unwrap_or_default();
        let unsupported = |reason: String| {
            Err(Error::InvalidUrl {
                url: url.to_owned(),
                reason,
            })
        };
        match scheme {
            #[cfg(feature = "sqlite")]
            "sqlite" => Ok((
                Backend::Sqlite(sqlite::connect(url, config).await?),
                Wakeups::local(),
            )),
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => {
                let pg = postgres::connect(url, config).await?;
                let wake = postgres::notify::wakeups(&pg.pool);
                Ok((Backend::Postgres(pg), wake))
            }
            #[cfg(not(feature = "sqlite"))]
            "sqlite" => {
                unsupported("this build has no SQLite backend (the `sqlite` feature is off)".into())
            }
            #[cfg(not(feature = "postgres"))]
            "postgres" | "postgresql" => unsupported(
                "this build has no PostgreSQL backend (the `postgres` feature is off)".into(),
            ),
            "" => unsupported("no scheme: expected sqlite:… or postgres://…".into()),
            other => unsupported(format!(
                "unsupported scheme `{other}`: expected `sqlite` or `postgres`"
            )),
        }
    }

    /// The file a URL names, read from the URL alone, for a driver whose database is
    /// a file: `None` otherwise.
    pub(crate) fn file_of(url: &str) -> Option<std::path::PathBuf> {
        #[cfg(feature = "sqlite")]
        if url.split(':').next() == Some("sqlite") {
            return sqlite::file_of(url);
        }
        let _ = url;
        None
    }
}

/// A borrowed connection of a driver, usually the inside of a transaction.
#[derive(Debug)]
pub(crate) enum ConnOf<'a> {
    #[cfg(feature = "sqlite")]
    Sqlite(&'a mut sqlx::SqliteConnection),
    #[cfg(feature = "postgres")]
    Postgres(&'a mut sqlx::PgConnection),
}

impl ConnOf<'_> {
    /// The same connection, borrowed again.
    pub(crate) fn reborrow(&mut self) -> ConnOf<'_> {
        match self {
            #[cfg(feature = "sqlite")]
            ConnOf::Sqlite(c) => ConnOf::Sqlite(c),
            #[cfg(feature = "postgres")]
            ConnOf::Postgres(c) => ConnOf::Postgres(c),
        }
    }
}

/// A driver's pool to read with.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ReaderOf<'a> {
    #[cfg(feature = "sqlite")]
    Sqlite(&'a sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(&'a sqlx::PgPool),
}

/// A driver's write transaction, with what its lane keeps in it.
#[derive(Debug)]
pub(crate) enum TxOf {
    #[cfg(feature = "sqlite")]
    Sqlite(sqlite::held::SqliteTx),
    #[cfg(feature = "postgres")]
    Postgres(postgres::pgtx::PgTx),
}

/// A driver's hold of an exclusive right ([`Store::try_exclusive`](crate::Store::try_exclusive)).
#[derive(Debug)]
pub(crate) enum HoldOf {
    #[cfg(feature = "sqlite")]
    Sqlite(sqlite::exclusive::Hold),
    #[cfg(feature = "postgres")]
    Postgres(postgres::exclusive::Session),
}

/// Runs `$body` with `$h` bound to the driver's hold of an exclusive right.
macro_rules! on_hold {
    ($hold:expr, $h:ident => $body:expr) => {
        match $hold {
            #[cfg(feature = "sqlite")]
            $crate::drivers::HoldOf::Sqlite($h) => $body,
            #[cfg(feature = "postgres")]
            $crate::drivers::HoldOf::Postgres($h) => $body,
        }
    };
}

/// Runs `$body` with `$b` bound to the open database of its driver, whichever it is.
macro_rules! on_backend {
    ($backend:expr, $b:ident => $body:expr) => {
        match $backend {
            #[cfg(feature = "sqlite")]
            $crate::drivers::Backend::Sqlite($b) => $body,
            #[cfg(feature = "postgres")]
            $crate::drivers::Backend::Postgres($b) => $body,
        }
    };
}

/// Runs `$body` with `$c` bound to the driver's connection and `$d` naming the
/// driver's type.
macro_rules! on_conn {
    ($conn:expr, $d:ident, $c:ident => $body:expr) => {
        match $conn {
            #[cfg(feature = "sqlite")]
            $crate::drivers::ConnOf::Sqlite($c) => {
                #[allow(dead_code)]
                type $d = $crate::drivers::sqlite::Sqlite;
                $body
            }
            #[cfg(feature = "postgres")]
            $crate::drivers::ConnOf::Postgres($c) => {
                #[allow(dead_code)]
                type $d = $crate::drivers::postgres::Postgres;
                $body
            }
        }
    };
}

/// Runs `$body` with `$t` bound to the driver's transaction.
macro_rules! on_tx {
    ($tx:expr, $t:ident => $body:expr) => {
        match $tx {
            #[cfg(feature = "sqlite")]
            $crate::drivers::TxOf::Sqlite($t) => $body,
            #[cfg(feature = "postgres")]
            $crate::drivers::TxOf::Postgres($t) => $body,
        }
    };
}

/// Runs `$body` with `$d` naming the driver of transaction `$tx` (a place, neither
/// moved nor borrowed).
macro_rules! on_tx_driver {
    ($tx:expr, $d:ident => $body:expr) => {
        match $tx {
            #[cfg(feature = "sqlite")]
            $crate::drivers::TxOf::Sqlite(_) => {
                #[allow(dead_code)]
                type $d = $crate::drivers::sqlite::Sqlite;
                $body
            }
            #[cfg(feature = "postgres")]
            $crate::drivers::TxOf::Postgres(_) => {
                #[allow(dead_code)]
                type $d = $crate::drivers::postgres::Postgres;
                $body
            }
        }
    };
}

/// Runs `$body` with `$p` bound to the driver's pool and `$d` naming the driver's type.
macro_rules! on_reader {
    ($pool:expr, $d:ident, $p:ident => $body:expr) => {
        match $pool {
            #[cfg(feature = "sqlite")]
            $crate::drivers::ReaderOf::Sqlite($p) => {
                #[allow(dead_code)]
                type $d = $crate::drivers::sqlite::Sqlite;
                $body
            }
            #[cfg(feature = "postgres")]
            $crate::drivers::ReaderOf::Postgres($p) => {
                #[allow(dead_code)]
                type $d = $crate::drivers::postgres::Postgres;
                $body
            }
        }
    };
}

pub(crate) use {on_backend, on_conn, on_hold, on_reader, on_tx, on_tx_driver};

/// The embedded migrations of each driver, applied by
/// [`Store::connect`](crate::Store::connect), and a look at a database's migrations
/// that changes nothing (for tools that migrate or inspect a database themselves).
pub mod migrate {
    #[cfg(feature = "postgres")]
    pub use super::postgres::POSTGRES_MIGRATOR;
    #[cfg(feature = "sqlite")]
    pub use super::sqlite::SQLITE_MIGRATOR;

    /// What a read-only look at an existing database found ([`probe`]).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Probe {
        /// It holds agentsaga's `outbox` table.
        pub has_outbox: bool,
        /// The versions of the migrations applied, in order (none before the first).
        pub applied: Vec<i64>,
    }

    /// The migrations this build embeds for the backend `url` names; `None` for a
    /// scheme this build has no driver for.
    pub fn embedded(url: &str) -> Option<&'static sqlx::migrate::Migrator> {
        match url.split(':').next().unwrap_or_default() {
            #[cfg(feature = "sqlite")]
            "sqlite" => Some(&SQLITE_MIGRATOR),
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => Some(&POSTGRES_MIGRATOR),
            _ => None,
        }
    }

    /// Looks at the database at `url` on a plain connection of its own, read-only:
    /// nothing is created (a SQLite file that does not exist is an error) or migrated.
    /// `None` for a URL the store would refuse or an in-memory database (nothing to
    /// look at); the store then says why. A server that does not answer within
    /// `timeout` is an error.
    ///
    /// # Errors
    /// [`Error::Connect`](crate::Error::Connect) if it cannot be opened (the driver's
    /// own words: "connection refused", "password authentication failed");
    /// [`Error::Database`](crate::Error::Database) if it cannot be read.
    pub async fn probe(url: &str, timeout: std::time::Duration) -> crate::Result<Option<Probe>> {
        match url.split(':').next().unwrap_or_default() {
            #[cfg(feature = "sqlite")]
            "sqlite" => super::sqlite::probe(url).await,
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => super::postgres::probe(url, timeout).await,
            _ => {
                let _ = timeout;
                Ok(None)
            }
        }
    }
}
