//! Scratch databases for the benches: SQLite files in fresh temp directories, and
//! PostgreSQL databases in the throwaway server of `agentsaga_core::testing` (or in the
//! server named by `AGENTSAGA_BENCH_PG_URL`). Everything is removed by
//! [`Scratch::cleanup`].

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Connection, PgConnection};

/// The environment variable naming a PostgreSQL server to use instead of the
/// throwaway one.
pub(crate) const PG_URL_ENV: &str = "AGENTSAGA_BENCH_PG_URL";

/// A database backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// SQLite.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

impl Backend {
    /// `"sqlite"` or `"postgres"`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }
}

/// The PostgreSQL server in use.
#[derive(Debug)]
struct PgServer {
    /// A URL to it; the database part is replaced for each scratch database.
    base_url: String,
    /// Whether it is the throwaway server.
    throwaway: bool,
}

/// Scratch databases created so far, to be removed at the end.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    pg: Option<PgServer>,
    sqlite_dirs: Vec<PathBuf>,
    pg_databases: Vec<String>,
}

impl Scratch {
    /// Nothing created yet; the PostgreSQL server starts on first use.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A URL to a fresh, empty database (no tables: the store or the migrator makes
    /// them).
    pub(crate) async fn fresh_url(&mut self, backend: Backend) -> anyhow::Result<String> {
        match backend {
            Backend::Sqlite => self.sqlite_file(None),
            Backend::Postgres => self.pg_database(None).await,
        }
    }

    /// A URL to a fresh copy of the database at `template` (a URL from this scratch,
    /// closed by everyone): a file copy on SQLite, `CREATE DATABASE … TEMPLATE` on
    /// PostgreSQL.
    pub(crate) async fn copy_of(
        &mut self,
        backend: Backend,
        template: &str,
    ) -> anyhow::Result<String> {
        match backend {
            Backend::Sqlite => self.sqlite_file(Some(template)),
            Backend::Postgres => self.pg_database(Some(database_name(template))).await,
        }
    }

    fn sqlite_file(&mut self, template: Option<&str>) -> anyhow::Result<String> {
        let dir =
            std::env::temp_dir().join(format!("agentsaga-bench-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let file = dir.join("bench.db");
        self.sqlite_dirs.push(dir);
        if let Some(template) = template {
            let from = template
                .strip_prefix("sqlite://")
                .with_context(|| format!("not a sqlite:// URL: {template}"))?;
            std::fs::copy(from, &file)
                .with_context(|| format!("copying {from} to {}", file.display()))?;
        }
        Ok(format!("sqlite://{}", file.display()))
    }

    async fn pg_database(&mut self, template: Option<&str>) -> anyhow::Result<String> {
        let base = self.pg().await?.base_url.clone();
        let name = format!("bench_{}", uuid::Uuid::now_v7().simple());
        let sql = match template {
            Some(t) => format!(r#"CREATE DATABASE "{name}" TEMPLATE "{t}""#),
            None => format!(r#"CREATE DATABASE "{name}""#),
        };
        let mut admin = PgConnection::connect(&base)
            .await
            .with_context(|| format!("connecting to {}", redact(&base)))?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
            .execute(&mut admin)
            .await
            .with_context(|| sql)?;
        admin.close().await?;
        self.pg_databases.push(name.clone());
        Ok(with_database(&base, &name))
    }

    /// One line on the server and its durability settings, for the report.
    pub(crate) async fn describe(&mut self, backend: Backend) -> anyhow::Result<String> {
        match backend {
            Backend::Sqlite => {
                let url = self.fresh_url(Backend::Sqlite).await?;
                let pool = plain_sqlite(&url).await?;
                let version: String = sqlx::query_scalar("SELECT sqlite_version()")
                    .fetch_one(&pool)
                    .await?;
                let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
                    .fetch_one(&pool)
                    .await?;
                let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
                    .fetch_one(&pool)
                    .await?;
                pool.close().await;
                Ok(format!(
                    "sqlite: SQLite {version}, a fresh file per database under {} \
                     (journal_mode={journal}, synchronous={}); plain-sqlx floors use the \
                     same settings, one connection, BEGIN IMMEDIATE like the store",
                    std::env::temp_dir().display(),
                    match sync {
                        0 => "OFF",
                        1 => "NORMAL",
                        2 => "FULL",
                        _ => "EXTRA",
                    }
                ))
            }
            Backend::Postgres => {
                let server = self.pg().await?;
                let (base, throwaway) = (server.base_url.clone(), server.throwaway);
                let mut conn = PgConnection::connect(&base).await?;
                let (version, fsync, sync_commit, fpw): (String, String, String, String) =
                    sqlx::query_as(
                        "SELECT current_setting('server_version'), current_setting('fsync'),
                                current_setting('synchronous_commit'),
                                current_setting('full_page_writes')",
                    )
                    .fetch_one(&mut conn)
                    .await?;
                conn.close().await?;
                let which = if throwaway {
                    "the throwaway server of agentsaga_core::testing".to_owned()
                } else {
                    format!("the server of {PG_URL_ENV}")
                };
                let warning = if fsync == "off" || sync_commit == "off" {
                    ": commits wait for no disk flush, so commit-bound figures are \
                     higher than on a durable server"
                } else {
                    ""
                };
                Ok(format!(
                    "postgres: PostgreSQL {version}, {which}, fsync={fsync}, \
                     synchronous_commit={sync_commit}, full_page_writes={fpw}{warning}"
                ))
            }
        }
    }

    /// The PostgreSQL server, started on first use.
    async fn pg(&mut self) -> anyhow::Result<&PgServer> {
        if self.pg.is_none() {
            let server = match std::env::var(PG_URL_ENV) {
                Ok(url) if !url.trim().is_empty() => PgServer {
                    base_url: url.trim().to_owned(),
                    throwaway: false,
                },
                _ => {
                    eprintln!("starting the throwaway PostgreSQL server (fsync=off) ...");
                    // initdb and pg_ctl block: keep them off the runtime's workers.
                    let base_url = tokio::task::spawn_blocking(|| {
                        agentsaga_core::testing::pg_server().admin_url()
                    })
                    .await
                    .context("starting the throwaway PostgreSQL server")?;
                    PgServer {
                        base_url,
                        throwaway: true,
                    }
                }
            };
            self.pg = Some(server);
        }
        self.pg.as_ref().context("the PostgreSQL server is not set")
    }

    /// Drops the PostgreSQL databases and removes the SQLite directories created.
    /// Failures are reported on stderr, not fatal.
    pub(crate) async fn cleanup(&mut self) {
        for dir in self.sqlite_dirs.drain(..) {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                eprintln!("warning: cannot remove {}: {e}", dir.display());
            }
        }
        let Some(server) = &self.pg else { return };
        if self.pg_databases.is_empty() {
            return;
        }
        let mut admin = match PgConnection::connect(&server.base_url).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("warning: cannot connect to drop the scratch databases: {e}");
                return;
            }
        };
        for name in self.pg_databases.drain(..) {
            let sql = format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#);
            if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut admin)
                .await
            {
                eprintln!("warning: cannot drop database {name}: {e}");
            }
        }
        let _ = admin.close().await;
    }
}

/// `synchronous = FULL` for every SQLite database of this run (the `saga` bench's
/// `--sqlite-synchronous full`): the floors' pools and the runtime's store alike.
pub(crate) static SQLITE_FULL_SYNC: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// `--answers-via-outbox`: the runtime sends every agent's answer through the outbox.
pub(crate) static ANSWERS_VIA_OUTBOX: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Whether this run's runtimes send answers through the outbox (see
/// [`ANSWERS_VIA_OUTBOX`]).
pub(crate) fn answers_via_outbox() -> bool {
    ANSWERS_VIA_OUTBOX.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether this run's SQLite databases are `synchronous = FULL`.
pub(crate) fn sqlite_full_sync() -> bool {
    SQLITE_FULL_SYNC.load(std::sync::atomic::Ordering::Relaxed)
}

/// A plain sqlx SQLite pool with the store's settings (WAL, `synchronous = NORMAL`, or
/// FULL if [`sqlite_full_sync`], busy timeout), one connection like the store's
/// writer, the migrations applied.
pub(crate) async fn plain_sqlite(url: &str) -> anyhow::Result<SqlitePool> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(if sqlite_full_sync() {
            SqliteSynchronous::Full
        } else {
            SqliteSynchronous::Normal
        })
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options)
        .await?;
    agentsaga_core::migrate::SQLITE_MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// A plain sqlx PostgreSQL pool of the store's default size (16), the migrations
/// applied.
pub(crate) async fn plain_postgres(url: &str) -> anyhow::Result<PgPool> {
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(60))
        .connect(url)
        .await?;
    agentsaga_core::migrate::POSTGRES_MIGRATOR
        .run(&pool)
        .await?;
    Ok(pool)
}

/// `url` with its database (path) replaced by `name`, query string kept.
fn with_database(url: &str, name: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let host_start = head.find("://").map_or(0, |i| i + 3);
    let base = match head[host_start..].find('/') {
        Some(i) => &head[..host_start + i],
        None => head,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// The database (last path segment) of a PostgreSQL URL.
fn database_name(url: &str) -> &str {
    let head = url.split_once('?').map_or(url, |(h, _)| h);
    head.rsplit_once('/').map_or(head, |(_, name)| name)
}

/// `url` without its passwords, for messages.
fn redact(url: &str) -> String {
    agentsaga_core::redact::redact_url(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_database() {
        assert_eq!(
            with_database("postgres://u@127.0.0.1:5432/postgres", "b"),
            "postgres://u@127.0.0.1:5432/b"
        );
        assert_eq!(
            with_database("postgres://u:p@h/db?sslmode=disable", "b"),
            "postgres://u:p@h/b?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h:1", "b"), "postgres://h:1/b");
    }

    #[test]
    fn finds_the_database() {
        assert_eq!(database_name("postgres://u@h:1/bench_1?x=y"), "bench_1");
        assert_eq!(database_name("postgres://u@h:1/bench_2"), "bench_2");
    }

    #[test]
    fn hides_passwords() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }
}
