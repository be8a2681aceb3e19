//! The SQLite driver: everything of the store that is SQLite's.
//!
//! - the database: one writer, a read pool, the migrations ([`SQLITE_MIGRATOR`]) and
//!   their runner, the WAL's background checkpoints ([`checkpoint`]);
//! - its statements ([`dialect`]: the store's [`Dialect`](crate::store::backend::Dialect),
//!   [`claim`]: the relay's claim and acknowledgement as the lane runs them);
//! - its lane ([`lane`]: the task that shares one write transaction among the hops
//!   ready at once, [`tx`]: the lane's side of a [`Tx`](crate::Tx), [`open`]: a hop's
//!   opening round trip, [`tail`]: a hop's deferred last write);
//! - its hot-path writes as data ([`write`]: a [`Writes`](crate::store::write::Writes)
//!   rendered as statements; [`statements`]) and the session that runs them on
//!   the connection directly ([`direct`], the crate's only `unsafe` code).
//!
//! Times are Unix milliseconds from this process's clock. Lists of rows travel as one
//! JSON array bound to `json_each`, so every batch is one prepared statement whatever
//! its size.

pub(crate) mod checkpoint;
pub(crate) mod claim;
pub(crate) mod dialect;
pub(crate) mod direct;
pub(crate) mod driver;
pub(crate) mod exclusive;
pub(crate) mod held;
pub(crate) mod lane;
pub(crate) mod open;
pub(crate) mod sql;
pub(crate) use sql::probe;
pub(crate) mod statements;
pub(crate) mod tail;
pub(crate) mod tx;
pub(crate) mod types;
pub(crate) mod write;

use std::str::FromStr;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use self::checkpoint::Checkpointer;
use crate::store::config::{StoreConfig, Synchronous};
use crate::store::schema::check_schema;
use crate::{Error, Result};

/// Migrations for SQLite, embedded in the binary.
pub static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// An open SQLite database: one writer connection that every write transaction queues
/// for (so that writers in this process never meet `SQLITE_BUSY`), and a pool of
/// read-only connections (the writer itself for `sqlite::memory:`).
#[derive(Clone, Debug)]
pub(crate) struct Sqlite {
    /// The store's clock: SQLite's rows carry its milliseconds.
    pub(crate) clock: crate::clock::Clock,
    pub(crate) writer: SqlitePool,
    pub(crate) reader: SqlitePool,
    /// Checkpoints the WAL off the writer's path (`None` in memory: no WAL).
    pub(crate) checkpoints: Option<Checkpointer>,
}

/// The two times of a claim, from the store's clock: now (rows due by it) and the
/// leases' now (rows leased until a lease from it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClaimTimes {
    pub(crate) now: i64,
    pub(crate) lease_now: i64,
}

impl ClaimTimes {
    pub(crate) fn of(clock: &crate::clock::Clock) -> Self {
        let (now, lease_now) = clock.now_and_lease_ms();
        Self { now, lease_now }
    }
}

/// Opens (creating and migrating if need be) the database.
///
/// Processes that open one new file at the same moment race to create it, switch it to
/// WAL and migrate it, and SQLite answers the loser with `SQLITE_BUSY` at once (its busy
/// handler would deadlock there), so opening tries again, within the busy timeout.
pub(crate) async fn connect(url: &str, config: &StoreConfig) -> Result<Sqlite> {
    direct::memory_statistics_off();
    let deadline = tokio::time::Instant::now() + config.busy_timeout;
    let mut delay = std::time::Duration::from_millis(10);
    loop {
        match open_once(url, config).await {
            Err(e) if is_busy(&e) && tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "sqlite database busy while opening; trying again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_millis(200));
            }
            done => return done,
        }
    }
}

/// Is this SQLITE_BUSY or SQLITE_LOCKED (any extended code), however wrapped?
pub(crate) fn is_busy(e: &Error) -> bool {
    // `Error::Database` is transparent: its `source()` skips the sqlx error it holds.
    let mut cur: Option<&(dyn std::error::Error + 'static)> = match e {
        Error::Database(db) => Some(db),
        e => Some(e),
    };
    while let Some(err) = cur {
        if let Some(sqlx::Error::Database(db)) = err.downcast_ref::<sqlx::Error>() {
            let code: i64 = db.code().and_then(|c| c.parse().ok()).unwrap_or(0);
            if matches!(code & 0xff, 5 | 6) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// The file `url` names, `None` if in memory or not a SQLite URL this build parses.
pub(crate) fn file_of(url: &str) -> Option<std::path::PathBuf> {
    if is_memory(url) {
        return None;
    }
    let options = SqliteConnectOptions::from_str(url).ok()?;
    let path = options.get_filename();
    (!path.as_os_str().is_empty()).then(|| path.to_path_buf())
}

fn is_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

async fn open_once(url: &str, config: &StoreConfig) -> Result<Sqlite> {
    let invalid = |e: sqlx::Error| Error::InvalidUrl {
        url: url.to_owned(),
        reason: e.to_string(),
    };
    let base = SqliteConnectOptions::from_str(url).map_err(invalid)?;
    let memory = is_memory(url);
    let options = base
        .create_if_missing(true)
        .journal_mode(if memory {
            SqliteJournalMode::Memory
        } else {
            SqliteJournalMode::Wal
        })
        .synchronous(match config.synchronous {
            Synchronous::Normal => SqliteSynchronous::Normal,
            Synchronous::Full => SqliteSynchronous::Full,
        })
        .busy_timeout(config.busy_timeout)
        .foreign_keys(true)
        // Temporary files in memory: above all the statement journals that every hop's
        // savepoint keeps in a shared transaction (a copy of each page it first
        // changes), which in files cost a `pwrite` each, two thirds of the writer's
        // system calls in the saga bench.
        .pragma("temp_store", "MEMORY");
    // The WAL's checkpoints run in the background (see `checkpoint`); the writer's own
    // only past a threshold, as a safety net.
    let options = if memory {
        options
    } else {
        options.pragma("wal_autocheckpoint", checkpoint::WRITER_PAGES.to_string())
    };
    let connect = |e| Error::Connect {
        scheme: "sqlite",
        source: e,
    };
    // One writer connection: writers of this process queue for it instead of fighting
    // over SQLite's single write lock (which surfaces as SQLITE_BUSY).
    // No ping before each acquire: the connection is a file handle in this process,
    // not a socket that can hang up, and on SQLite a ping is one more round trip to
    // sqlx's worker thread on every transaction (the pool still pings on release).
    let writer = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .test_before_acquire(false)
        .acquire_timeout(config.acquire_timeout)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options.clone())
        .await
        .map_err(connect)?;
    check_schema(
        &applied(&mut *writer.acquire().await?).await?,
        &SQLITE_MIGRATOR,
    )?;
    migrate(&writer).await?;
    foreign_keys_on(&writer).await?;
    let reader = if memory {
        // Each connection to `:memory:` is a database of its own: share the writer.
        writer.clone()
    } else {
        SqlitePoolOptions::new()
            .max_connections(config.max_connections)
            .test_before_acquire(false)
            .acquire_timeout(config.acquire_timeout)
            .connect_with(options.clone().read_only(true))
            .await
            .map_err(connect)?
    };
    let checkpoints = (!memory).then(|| Checkpointer::start(options));
    Ok(Sqlite {
        clock: config.clock.clone(),
        writer,
        reader,
        checkpoints,
    })
}

/// Applies the embedded migrations. SQLite has no lock for this (sqlx's is a no-op
/// there), so two processes opening one new file may both try a migration. The loser's
/// fails ("table already exists") and is rolled back; or, for a migration that runs
/// its own transaction (0009, `-- no-transaction`), it waits for the winner's to commit,
/// repeats its work on the migrated tables (the same result) and fails on recording the
/// version the winner recorded. When the applied migrations changed during a failed
/// run, another process is migrating: run again, and skip what it applied.
async fn migrate(writer: &SqlitePool) -> Result<()> {
    for _ in 0..=SQLITE_MIGRATOR.iter().count() {
        let before = applied(&mut *writer.acquire().await?).await?;
        match SQLITE_MIGRATOR.run(writer).await {
            Ok(()) => return Ok(()),
            Err(e) if applied(&mut *writer.acquire().await?).await? == before => {
                return Err(e.into());
            }
            Err(e) => tracing::debug!(error = %e, "another process is migrating; running again"),
        }
    }
    Ok(SQLITE_MIGRATOR.run(writer).await?)
}

/// Turns foreign keys on again on the writer, and checks that they are. Migration 0009
/// turns them off while it rebuilds tables and back on at its end; a run of it that
/// failed midway (another process migrating at the same time, a busy timeout) and was
/// skipped on the retry would otherwise leave the writer without them for the life of
/// the process: no cascade from a pruned saga to its steps, no check of a step's saga.
async fn foreign_keys_on(writer: &SqlitePool) -> Result<()> {
    sqlx::query("PRAGMA foreign_keys = ON")
        .execute(writer)
        .await?;
    let on: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
        .fetch_one(writer)
        .await?;
    if on != 1 {
        return Err(Error::Database(sqlx::Error::Protocol(
            "SQLite refused to turn foreign keys on (a transaction left open?)".to_owned(),
        )));
    }
    Ok(())
}

/// The versions of the migrations applied, in order (none before the first).
pub(crate) async fn applied(c: &mut sqlx::SqliteConnection) -> Result<Vec<i64>> {
    let exists: Option<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_optional(&mut *c)
    .await?;
    if exists.is_none() {
        return Ok(Vec::new());
    }
    Ok(
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(&mut *c)
            .await?,
    )
}
