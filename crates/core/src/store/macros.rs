//! The exported macros that let a crate above name both backends and get the ones
//! this build has.

// The exported macros below exist in one version per set of compiled backends, so that
// the arms they expand to are chosen by this crate's features, not by the caller's: a
// crate above (the saga engine, your code) names both backends and gets the ones built.

/// Matches a [`Conn`](crate::Conn) with one arm per backend, keeping only the arms of the backends
/// this build has: `match_conn!(conn, sqlite(c) => …, postgres(c) => …)`. The arm of
/// a backend left out is never compiled, so it may name that backend's types.
#[cfg(all(feature = "sqlite", feature = "postgres"))]
#[macro_export]
macro_rules! match_conn {
    ($conn:expr, sqlite($s:ident) => $sb:expr, postgres($p:ident) => $pb:expr $(,)?) => {
        match $conn {
            $crate::Conn::Sqlite($s) => $sb,
            $crate::Conn::Postgres($p) => $pb,
        }
    };
}

/// Matches a [`Conn`](crate::Conn) with one arm per backend (this build: SQLite only).
#[cfg(all(feature = "sqlite", not(feature = "postgres")))]
#[macro_export]
macro_rules! match_conn {
    ($conn:expr, sqlite($s:ident) => $sb:expr, postgres($p:ident) => $pb:expr $(,)?) => {
        match $conn {
            $crate::Conn::Sqlite($s) => $sb,
        }
    };
}

/// Matches a [`Conn`](crate::Conn) with one arm per backend (this build: PostgreSQL only).
#[cfg(all(not(feature = "sqlite"), feature = "postgres"))]
#[macro_export]
macro_rules! match_conn {
    ($conn:expr, sqlite($s:ident) => $sb:expr, postgres($p:ident) => $pb:expr $(,)?) => {
        match $conn {
            $crate::Conn::Postgres($p) => $pb,
        }
    };
}

/// Matches a [`ReadPool`](crate::ReadPool) with one arm per backend, as
/// [`match_conn!`](crate::match_conn) does for a [`Conn`](crate::Conn).
#[cfg(all(feature = "sqlite", feature = "postgres"))]
#[macro_export]
macro_rules! match_reader {
    ($pool:expr, sqlite($s:ident) => $sb:expr, postgres($p:ident) => $pb:expr $(,)?) => {
        match $pool {
            $crate::ReadPool::Sqlite($s) => $sb,
            $crate::ReadPool::Postgres($p) => $pb,
        }
    };
}

/// Matches a [`ReadPool`](crate::ReadPool) (this build: SQLite only).
#[cfg(all(feature = "sqlite", not(feature = "postgres")))]
#[macro_export]
macro_rules! match_reader {
    ($pool:expr, sqlite($s:ident) => $sb:expr, postgres($p:ident) => $pb:expr $(,)?) => {
        match $pool {
            $crate::ReadPool::Sqlite($s) => $sb,
        }
    };
}

/// Matches a [`ReadPool`](crate::ReadPool) (this build: PostgreSQL only).
#[cfg(all(not(feature = "sqlite"), feature = "postgres"))]
#[macro_export]
macro_rules! match_reader {
    ($pool:expr, sqlite($s:ident) => $sb:expr, postgres($p:ident) => $pb:expr $(,)?) => {
        match $pool {
            $crate::ReadPool::Postgres($p) => $pb,
        }
    };
}

/// Keeps its items only in a build with the SQLite backend (the code of a crate above
/// that names SQLite's types).
#[cfg(feature = "sqlite")]
#[macro_export]
macro_rules! if_sqlite {
    ($($item:item)*) => { $($item)* };
}

/// Keeps its items only in a build with the SQLite backend (this build has none).
#[cfg(not(feature = "sqlite"))]
#[macro_export]
macro_rules! if_sqlite {
    ($($item:item)*) => {};
}

/// Keeps its items only in a build with the PostgreSQL backend.
#[cfg(feature = "postgres")]
#[macro_export]
macro_rules! if_postgres {
    ($($item:item)*) => { $($item)* };
}

/// Keeps its items only in a build with the PostgreSQL backend (this build has none).
#[cfg(not(feature = "postgres"))]
#[macro_export]
macro_rules! if_postgres {
    ($($item:item)*) => {};
}

/// Runs the same code on a [`Conn`](crate::Conn) of either backend: `$c` is the backend's
/// `&mut` connection in each arm. For statements whose text and binds suit both (sqlx
/// numbers parameters `$1, $2, …` on SQLite too).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), agentsaga_core::Error> {
/// let store = agentsaga_core::Store::connect("sqlite::memory:").await?;
/// let mut tx = store.begin().await?;
/// let n: i64 = agentsaga_core::with_conn!(tx.conn(), c => {
///     agentsaga_core::sqlx::query_scalar("SELECT count(*) FROM outbox WHERE destination = $1")
///         .bind("billing")
///         .fetch_one(c)
///         .await?
/// });
/// assert_eq!(n, 0);
/// # Ok(()) }
/// ```
#[macro_export]
macro_rules! with_conn {
    ($conn:expr, $c:ident => $body:expr) => {
        $crate::match_conn!($conn, sqlite($c) => $body, postgres($c) => $body)
    };
}

/// Runs the same code on a [`ReadPool`](crate::ReadPool) of either backend: `$p` is the
/// backend's pool in each arm. See [`with_conn!`](crate::with_conn).
#[macro_export]
macro_rules! with_reader {
    ($pool:expr, $p:ident => $body:expr) => {
        $crate::match_reader!($pool, sqlite($p) => $body, postgres($p) => $body)
    };
}
