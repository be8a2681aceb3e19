//! Test support: fresh databases for both backends and a throwaway PostgreSQL
//! server per test binary; the outbox driven by hand ([`envelope`], [`claim`],
//! [`pump`]); one bounded wait ([`wait_until`]); a throwaway `nats-server -js`
//! ([`NatsServer`]).
//!
//! Enabled by the `testing` feature. The PostgreSQL server is started on first
//! use (see [`pg_server`]) from the binaries in `/usr/lib/postgresql/15/bin`
//! (or the directory named by the `AGENTSAGA_PG_BIN` environment variable), in
//! a fresh temporary directory, and is stopped and removed by a watchdog
//! process once the test binary has exited, however it exited.
//!
//! Tests that should run against both backends write one body and use
//! [`both_backends!`](crate::both_backends):
//!
//! ```ignore
//! use agentsaga_core::testing::{fresh_url, Backend};
//!
//! async fn opens(backend: Backend) {
//!     let url = fresh_url(backend).await;
//!     // ...
//! }
//!
//! agentsaga_core::both_backends!(opens_tests, opens);
//! ```

mod nats;
#[cfg(feature = "postgres")]
mod pg;
mod relay;
mod watchdog;

pub use nats::NatsServer;
#[cfg(feature = "postgres")]
pub use pg::{PgServer, pg_server};
pub use relay::{OWNER, claim, envelope, pump};

use std::fs;
use std::path::PathBuf;
#[cfg(feature = "sqlite")]
use std::sync::OnceLock;
use std::time::Duration;

use uuid::Uuid;

/// Which database a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// SQLite, in a file in a fresh temporary directory.
    Sqlite,
    /// PostgreSQL, a fresh database in the per-process throwaway server.
    Postgres,
}

/// A URL to a fresh, empty database of that backend.
///
/// * [`Backend::Sqlite`]: `sqlite://<fresh temp dir>/test.db`. The directory is
///   new and unique for each call (under [`std::env::temp_dir`], named with a
///   UUIDv7); the database file itself is not created.
/// * [`Backend::Postgres`]: creates a new database `t_<uuid>` in the
///   per-process throwaway server (`pg_server`) and returns
///   `postgres://postgres@127.0.0.1:<port>/<dbname>`.
///
/// # Panics
///
/// On any failure to provide the database: test infrastructure failures are
/// loud, never skipped. Asked for a backend this build does not have (which
/// [`both_backends!`](crate::both_backends) never does).
pub async fn fresh_url(backend: Backend) -> String {
    match backend {
        #[cfg(not(feature = "sqlite"))]
        Backend::Sqlite => panic!("agentsaga testing: this build has no SQLite backend"),
        #[cfg(feature = "sqlite")]
        Backend::Sqlite => {
            let dir = sqlite_root().join(Uuid::now_v7().simple().to_string());
            fs::create_dir_all(&dir).unwrap_or_else(|e| {
                panic!("agentsaga testing: cannot create {}: {e}", dir.display())
            });
            format!("sqlite://{}", dir.join("test.db").display())
        }
        #[cfg(feature = "postgres")]
        Backend::Postgres => pg_server().fresh_database_url().await,
        #[cfg(not(feature = "postgres"))]
        Backend::Postgres => panic!("agentsaga testing: this build has no PostgreSQL backend"),
    }
}
#[cfg(feature = "sqlite")]
/// One directory per test process for its SQLite databases, removed by a watchdog
/// when the process ends (however it ends).
fn sqlite_root() -> &'static PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let dir = unique_temp_dir("agentsaga-sqlite");
        // Without its watchdog the directory is only left behind: no reason to fail.
        let _ = watchdog::spawn(&format!("rm -rf {}", watchdog::shell_quote(&dir)));
        dir
    })
}

/// Create a new, unique directory `<temp>/<prefix>-<uuid v7>`.
fn unique_temp_dir(prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", Uuid::now_v7().simple()));
    fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("agentsaga testing: cannot create {}: {e}", dir.display()));
    dir
}

/// Polls `condition` every 10 ms until it holds; fails the test (panics) if it does not
/// within `within`. The one bounded wait of every crate's tests.
///
/// # Panics
/// When `within` passes first, naming `what`.
pub async fn wait_until(what: &str, within: Duration, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Arms the crash tests' hook in this process, from `before:<n>[:<skip>]` or
/// `after:<n>[:<skip>]`: past the first `skip` shared transactions (SQLite's lane,
/// PostgreSQL's set lane) holding at least `n` hops, the next one stops its lane just
/// before (or just after) its commit, forever, and says so on stderr, so that the test
/// can `kill -9` the process there. A build without the `testing` feature has no such
/// hook, and nothing arms it from the environment.
///
/// # Errors
/// A `spec` of another form, or a hook armed already.
pub fn stop_at_shared_commit(spec: &str) -> Result<(), String> {
    crate::store::crash_hook::arm(spec)
}

/// The backends this build has (of `agentsaga-core`'s features), SQLite first: for a
/// test that runs one body on each in turn.
pub fn backends() -> &'static [Backend] {
    &[
        #[cfg(feature = "sqlite")]
        Backend::Sqlite,
        #[cfg(feature = "postgres")]
        Backend::Postgres,
    ]
}

/// Run one async test body against both backends (those this build has).
///
/// `both_backends!(name, body_fn)` expands to a module `name` holding two
/// tests, `sqlite` and `postgres`, each a multi-threaded tokio test (two
/// workers) calling `super::body_fn(backend).await` with
/// [`Backend::Sqlite`](crate::testing::Backend::Sqlite) and
/// [`Backend::Postgres`](crate::testing::Backend::Postgres) respectively. The
/// body has the signature `async fn body_fn(backend: Backend)`. A build without
/// one of the backends (`--no-default-features --features sqlite`) has only the
/// other's test: which ones exist is decided by `agentsaga-core`'s features, not
/// the calling crate's.
///
/// ```ignore
/// async fn round_trip(backend: agentsaga_core::testing::Backend) {
///     let url = agentsaga_core::testing::fresh_url(backend).await;
///     // ...
/// }
/// agentsaga_core::both_backends!(round_trip_tests, round_trip);
/// ```
#[macro_export]
macro_rules! both_backends {
    ($name:ident, $body:ident $(,)?) => {
        mod $name {
            $crate::__backend_test!(sqlite, $body, Sqlite);
            $crate::__backend_test!(postgres, $body, Postgres);
        }
    };
}

/// One test of [`both_backends!`](crate::both_backends), or nothing for a backend this
/// build does not have. Not for use of its own.
#[doc(hidden)]
#[macro_export]
macro_rules! __backend_test {
    (sqlite, $body:ident, $variant:ident) => {
        $crate::__if_sqlite! {
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$body($crate::testing::Backend::$variant).await
            }
        }
    };
    (postgres, $body:ident, $variant:ident) => {
        $crate::__if_postgres! {
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$body($crate::testing::Backend::$variant).await
            }
        }
    };
}

/// Keeps its items in a build with the SQLite backend (of `agentsaga-core`'s
/// features). Not for use of its own.
#[doc(hidden)]
#[cfg(feature = "sqlite")]
#[macro_export]
macro_rules! __if_sqlite {
    ($($item:item)*) => { $($item)* };
}

#[doc(hidden)]
#[cfg(not(feature = "sqlite"))]
#[macro_export]
macro_rules! __if_sqlite {
    ($($item:item)*) => {};
}

/// Keeps its items in a build with the PostgreSQL backend. Not for use of its own.
#[doc(hidden)]
#[cfg(feature = "postgres")]
#[macro_export]
macro_rules! __if_postgres {
    ($($item:item)*) => { $($item)* };
}

#[doc(hidden)]
#[cfg(not(feature = "postgres"))]
#[macro_export]
macro_rules! __if_postgres {
    ($($item:item)*) => {};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "postgres")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_fresh_urls_are_distinct_working_databases() {
        let a = fresh_url(Backend::Postgres).await;
        let b = fresh_url(Backend::Postgres).await;
        assert_ne!(a, b);
        for url in [&a, &b] {
            use sqlx::Connection;
            assert!(url.starts_with("postgres://postgres@127.0.0.1:"), "{url}");
            let mut conn = sqlx::postgres::PgConnection::connect(url)
                .await
                .unwrap_or_else(|e| panic!("connect {url}: {e}"));
            let one: i32 = sqlx::query_scalar("SELECT 1")
                .fetch_one(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("SELECT 1 on {url}: {e}"));
            assert_eq!(one, 1);
            conn.close().await.expect("close");
        }
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_fresh_urls_are_distinct() {
        let a = fresh_url(Backend::Sqlite).await;
        let b = fresh_url(Backend::Sqlite).await;
        assert!(a.starts_with("sqlite://"), "{a}");
        assert!(b.starts_with("sqlite://"), "{b}");
        assert_ne!(a, b);
    }

    async fn backend_is_passed(backend: Backend) {
        let url = fresh_url(backend).await;
        let expected = match backend {
            Backend::Sqlite => "sqlite://",
            Backend::Postgres => "postgres://",
        };
        assert!(url.starts_with(expected), "{url}");
    }

    crate::both_backends!(macro_expands, backend_is_passed);
}
