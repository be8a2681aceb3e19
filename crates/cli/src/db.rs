//! Opening the database named on the command line, without ever creating a SQLite
//! file by accident.

use std::time::Duration;

use agentsaga_core::migrate::{self, Probe};
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
    let file = Store::database_file_of(&url);
    if let Some(file) = &file
        && !file.exists()
        && missing == Missing::Refuse
    {
        bail!(
            "database file `{}` does not exist (nothing was created; `agentsaga \
             migrate` creates a new database)",
            file.display()
        );
    }
    let found = if file.as_ref().is_some_and(|f| !f.exists()) {
        None
    } else {
        probe(&url).await?
    };
    let what = || match &file {
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
        if let Some(behind) = behind(found, &url) {
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

/// How the schema `found` is behind the migrations this binary embeds for `url`'s
/// backend, if it is: a phrase for the error.
fn behind(found: &Probe, url: &str) -> Option<String> {
    let migrator = migrate::embedded(url)?;
    let missing: Vec<i64> = migrator
        .iter()
        .map(|m| m.version)
        .filter(|v| !found.applied.contains(v))
        .collect();
    let newest = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    let at = found.applied.last().copied().unwrap_or(0);
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

/// Looks at the (existing) database read-only (see [`migrate::probe`]), its errors
/// told with the URL's passwords hidden.
async fn probe(url: &str) -> anyhow::Result<Option<Probe>> {
    migrate::probe(url, CONNECT_TIMEOUT).await.map_err(|e| {
        let what = match (Store::database_file_of(url), &e) {
            (Some(file), _) => format!("cannot read the database file `{}`", file.display()),
            (None, agentsaga_core::Error::Connect { scheme, .. }) => {
                format!("cannot open the {scheme} database at {}", redact(url))
            }
            (None, _) => format!("cannot open the database at {}", redact(url)),
        };
        let why = match &e {
            agentsaga_core::Error::Connect { source, .. } => source.to_string(),
            other => other.to_string(),
        };
        anyhow!("{what}: {}", why.replace(url, &redact(url)))
    })
}

/// The versions of the migrations applied to the (existing) database at `url`, read
/// without changing it; empty for a database agentsaga never migrated, or one that is
/// not there yet.
pub(crate) async fn applied(url: Option<&str>) -> anyhow::Result<Vec<i64>> {
    let Some(url) = url.map(str::trim).filter(|u| !u.is_empty()) else {
        return Ok(Vec::new());
    };
    let url = normalize(url);
    if Store::database_file_of(&url).is_some_and(|f| !f.exists()) {
        return Ok(Vec::new());
    }
    Ok(probe(&url).await?.map(|p| p.applied).unwrap_or_default())
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
        use std::path::PathBuf;
        let file = Store::database_file_of;
        assert_eq!(
            file("sqlite:///tmp/x.db?mode=rwc"),
            Some(PathBuf::from("/tmp/x.db"))
        );
        assert_eq!(file("sqlite:rel.db"), Some(PathBuf::from("rel.db")));
        assert_eq!(file("sqlite::memory:"), None);
        assert_eq!(file("postgres://h/db"), None);
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
