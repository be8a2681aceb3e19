//! Opening the database named on the command line, without ever creating a SQLite
//! file by accident.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use agentsaga_core::migrate::{POSTGRES_MIGRATOR, SQLITE_MIGRATOR};
use agentsaga_core::sqlx::postgres::{PgConnectOptions, PgConnection};
use agentsaga_core::sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use agentsaga_core::sqlx::{self, Connection as _};
use agentsaga_core::{Store, StoreConfig};
use anyhow::{anyhow, bail};

/// How long to wait for a database server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a missing SQLite file may be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    /// A missing file is an error (every command but `migrate`).
    Refuse,
    /// Create it (`migrate`).
    Create,
}

/// The URL to hand to the store: a bare path `file.db` becomes `sqlite://file.db`;
/// anything that starts with a scheme (`sqlite:`, `postgres://`, `mysql://`...) is kept
/// as it is, for the store to accept or refuse.
pub(crate) fn normalize(url: &str) -> String {
    if has_scheme(url) {
        url.to_owned()
    } else {
        format!("sqlite://{url}")
    }
}

fn has_scheme(url: &str) -> bool {
    let Some((scheme, _)) = url.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// The file a SQLite URL names, or `None` for an in-memory database, another
/// backend, or a URL the store will refuse anyway.
fn sqlite_file(url: &str) -> Option<PathBuf> {
    if !url.starts_with("sqlite:") || url.contains(":memory:") || url.contains("mode=memory") {
        return None;
    }
    let options = SqliteConnectOptions::from_str(url).ok()?;
    Some(options.get_filename().to_path_buf())
}

/// Opens the store at `url`.
///
/// Only `migrate` ([`Missing::Create`]) changes the schema: it creates a missing
/// SQLite file and applies the embedded migrations. Every other command
/// ([`Missing::Refuse`]) first looks at the database read-only and refuses, with
/// nothing changed, a database that agentsaga never migrated (a SQLite file that does
/// not exist, a database without the `outbox` table) or whose schema is behind this
/// binary (say to run `agentsaga migrate`): opening a store applies missing
/// migrations, and an operator's `status` must not upgrade a live database under
/// its runtimes.
///
/// # Errors
/// No URL given; a database refused as above; the store's own errors (bad URL,
/// unreachable server, schema too new).
pub(crate) async fn open(url: Option<&str>, missing: Missing) -> anyhow::Result<Store> {
    let Some(url) = url.map(str::trim).filter(|u| !u.is_empty()) else {
        bail!("no database given: pass --database-url URL or set DATABASE_URL");
    };
    let url = normalize(url);
    let found = if let Some(file) = sqlite_file(&url) {
        if !file.exists() {
            if missing == Missing::Refuse {
                bail!(
                    "database file `{}` does not exist (nothing was created; `agentsaga \
                     migrate` creates a new database)",
                    file.display()
                );
            }
            None
        } else {
            Some(sqlite_probe(&url, &file.display().to_string()).await?)
        }
    } else if url.starts_with("postgres") {
        Some(postgres_probe(&url).await?)
    } else {
        None
    };
    let what = || match sqlite_file(&url) {
        Some(file) => format!("database file `{}`", file.display()),
        None => format!("the database at {}", redact(&url)),
    };
    if missing == Missing::Refuse
        && let Some(found) = &found
    {
        if !found.has_outbox {
            bail!(
                "{} holds no agentsaga tables: nothing to inspect, and nothing was changed \
                 (`agentsaga migrate` creates them)",
                what()
            );
        }
        if let Some(behind) = found.behind(&url) {
            bail!(
                "{}: its schema is {behind}; nothing was changed. Run `agentsaga migrate` \
                 to upgrade it (runtimes older than this binary refuse the upgraded schema: \
                 upgrade them with it)",
                what()
            );
        }
    }
    // An operator waiting on a dead server wants to know soon.
    let config = StoreConfig::default()
        .max_connections(2)
        .acquire_timeout(CONNECT_TIMEOUT);
    Store::connect_with(&url, config).await.map_err(|e| {
        // The store's messages quote the URL as given: never print a password.
        anyhow!(e.to_string().replace(&url, &redact(&url)))
    })
}

/// What a read-only look at an existing database found.
#[derive(Debug)]
struct Probe {
    /// It holds the `outbox` table.
    has_outbox: bool,
    /// The versions of the migrations applied (`_sqlx_migrations`), in order.
    applied: Vec<i64>,
}

impl Probe {
    /// How the schema is behind the migrations this binary embeds for `url`'s
    /// backend, if it is: a phrase for the error.
    fn behind(&self, url: &str) -> Option<String> {
        let migrator = if url.starts_with("postgres") {
            &POSTGRES_MIGRATOR
        } else {
            &SQLITE_MIGRATOR
        };
        let missing: Vec<i64> = migrator
            .iter()
            .map(|m| m.version)
            .filter(|v| !self.applied.contains(v))
            .collect();
        let newest = migrator.iter().map(|m| m.version).max().unwrap_or(0);
        let at = self.applied.last().copied().unwrap_or(0);
        (!missing.is_empty()).then(|| {
            format!(
                "at version {at}, behind this binary's {newest} ({} migration(s) not applied: {})",
                missing.len(),
                missing
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }
}

const HAS_OUTBOX_SQLITE: &str =
    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'outbox'";
const HAS_MIGRATIONS_SQLITE: &str =
    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'";
const HAS_OUTBOX_POSTGRES: &str = "SELECT to_regclass('outbox') IS NOT NULL";
const HAS_MIGRATIONS_POSTGRES: &str = "SELECT to_regclass('_sqlx_migrations') IS NOT NULL";
const APPLIED: &str = "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version";

/// Looks at the (existing) SQLite file read-only: its `outbox` table, its migrations.
async fn sqlite_probe(url: &str, file: &str) -> anyhow::Result<Probe> {
    let Ok(options) = SqliteConnectOptions::from_str(url) else {
        // The store reports the malformed URL.
        return Ok(Probe {
            has_outbox: true,
            applied: all_versions(&SQLITE_MIGRATOR),
        });
    };
    let options = options.read_only(true).create_if_missing(false);
    let fail = |e: sqlx::Error| anyhow!("cannot read the database file `{file}`: {e}");
    let mut conn = SqliteConnection::connect_with(&options)
        .await
        .map_err(fail)?;
    let n: i64 = sqlx::query_scalar(HAS_OUTBOX_SQLITE)
        .fetch_one(&mut conn)
        .await
        .map_err(fail)?;
    let tracked: i64 = sqlx::query_scalar(HAS_MIGRATIONS_SQLITE)
        .fetch_one(&mut conn)
        .await
        .map_err(fail)?;
    let applied = if tracked > 0 {
        sqlx::query_scalar(APPLIED)
            .fetch_all(&mut conn)
            .await
            .map_err(fail)?
    } else {
        Vec::new()
    };
    let _ = conn.close().await;
    Ok(Probe {
        has_outbox: n > 0,
        applied,
    })
}

/// Looks at the database (in its search path): its `outbox` table, its migrations.
/// One plain connection first also gives a clear error: the pool would only say
/// "timed out" where the driver says "connection refused" or "password
/// authentication failed".
async fn postgres_probe(url: &str) -> anyhow::Result<Probe> {
    let Ok(options) = PgConnectOptions::from_str(url) else {
        // The store reports the malformed URL.
        return Ok(Probe {
            has_outbox: true,
            applied: all_versions(&POSTGRES_MIGRATOR),
        });
    };
    let fail = |why: String| {
        anyhow!(
            "cannot open the postgres database at {}: {}",
            redact(url),
            why.replace(url, &redact(url))
        )
    };
    let mut conn =
        match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options)).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(fail(e.to_string())),
            Err(_) => {
                return Err(fail(format!(
                    "no answer within {}s",
                    CONNECT_TIMEOUT.as_secs()
                )));
            }
        };
    let has_outbox: bool = sqlx::query_scalar(HAS_OUTBOX_POSTGRES)
        .fetch_one(&mut conn)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let tracked: bool = sqlx::query_scalar(HAS_MIGRATIONS_POSTGRES)
        .fetch_one(&mut conn)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let applied = if tracked {
        sqlx::query_scalar(APPLIED)
            .fetch_all(&mut conn)
            .await
            .map_err(|e| fail(e.to_string()))?
    } else {
        Vec::new()
    };
    let _ = conn.close().await;
    Ok(Probe {
        has_outbox,
        applied,
    })
}

fn all_versions(migrator: &sqlx::migrate::Migrator) -> Vec<i64> {
    migrator.iter().map(|m| m.version).collect()
}

/// The versions of the migrations applied to the (existing) database at `url`, read
/// without changing it; empty for a database agentsaga never migrated, or one that is
/// not there yet.
pub(crate) async fn applied(url: Option<&str>) -> anyhow::Result<Vec<i64>> {
    let Some(url) = url.map(str::trim).filter(|u| !u.is_empty()) else {
        return Ok(Vec::new());
    };
    let url = normalize(url);
    if let Some(file) = sqlite_file(&url) {
        if !file.exists() {
            return Ok(Vec::new());
        }
        return Ok(sqlite_probe(&url, &file.display().to_string())
            .await?
            .applied);
    }
    if url.starts_with("postgres") {
        return Ok(postgres_probe(&url).await?.applied);
    }
    Ok(Vec::new())
}

/// The URL with its passwords (user info and query string) replaced by `***`, for
/// messages.
pub(crate) fn redact(url: &str) -> String {
    agentsaga_core::redact::redact_url(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_paths_become_sqlite_urls() {
        assert_eq!(normalize("file.db"), "sqlite://file.db");
        assert_eq!(normalize("/tmp/x/file.db"), "sqlite:///tmp/x/file.db");
        assert_eq!(normalize("./a:b.db"), "sqlite://./a:b.db");
        assert_eq!(normalize("sqlite://f.db"), "sqlite://f.db");
        assert_eq!(normalize("sqlite:f.db"), "sqlite:f.db");
        assert_eq!(normalize("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(normalize("mysql://u@h/db"), "mysql://u@h/db");
    }

    #[test]
    fn sqlite_files() {
        assert_eq!(
            sqlite_file("sqlite:///tmp/x.db?mode=rwc"),
            Some(PathBuf::from("/tmp/x.db"))
        );
        assert_eq!(sqlite_file("sqlite:rel.db"), Some(PathBuf::from("rel.db")));
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("postgres://h/db"), None);
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("sqlite://f.db"), "sqlite://f.db");
        assert_eq!(
            redact("postgres://u@h/db?sslmode=disable&password=secret"),
            "postgres://u@h/db?sslmode=disable&password=***"
        );
    }
}
