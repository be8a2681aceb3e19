//! The PostgreSQL driver: everything of the store that is PostgreSQL's.
//!
//! - the database: one pool, the migrations ([`POSTGRES_MIGRATOR`]) and their runner;
//! - its statements ([`dialect`]: the store's [`Dialect`](crate::store::backend::Dialect));
//! - its lane ([`sets`]: the set lane, hops that share one transaction whose statements
//!   each serve all of them), the writes its hops keep as data ([`kept`]) and its
//!   rendering of [`Writes`](crate::store::write::Writes) ([`write`]);
//! - its notifications ([`notify`]: `LISTEN`/`NOTIFY` between processes).
//!
//! Times come from the database's clock (`now()`), so that timers mean the same thing
//! to every process sharing the database; leases count from
//! `pg_catalog.clock_timestamp()`, named in full (real time even under a test's manual
//! clock, [`clock`]). Lists of rows travel as arrays
//! (`= ANY($1)`, `unnest`): one statement per batch.

pub(crate) mod batch;
#[cfg(feature = "testing")]
pub(crate) mod clock;
pub(crate) mod dialect;
pub(crate) mod driver;
pub(crate) mod exclusive;
pub(crate) mod kept;
pub(crate) mod notify;
pub(crate) mod pgtx;
pub(crate) mod request;
pub(crate) mod sets;
pub(crate) mod sql;
pub(crate) use sql::probe;
pub(crate) mod tx;
pub(crate) mod types;
pub(crate) mod write;

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::store::config::StoreConfig;
use crate::store::schema::check_schema;
use crate::{Error, Result};

/// Migrations for PostgreSQL, embedded in the binary.
pub static POSTGRES_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// An open PostgreSQL database: one pool.
#[derive(Clone, Debug)]
pub(crate) struct Postgres {
    pub(crate) pool: PgPool,
}

pub(crate) async fn connect(url: &str, config: &StoreConfig) -> Result<Postgres> {
    let options = PgConnectOptions::from_str(url).map_err(|e| Error::InvalidUrl {
        url: url.to_owned(),
        reason: e.to_string(),
    })?;
    #[cfg(feature = "testing")]
    let manual_clock = config.clock.is_manual();
    #[cfg(feature = "testing")]
    let options = if manual_clock {
        options.options([("search_path", clock::SEARCH_PATH)])
    } else {
        options
    };
    let pool = PgPoolOptions::new()
        .max_connections(config.max_connections)
        .acquire_timeout(config.acquire_timeout)
        .connect_with(options)
        .await
        .map_err(|e| Error::Connect {
            scheme: "postgres",
            source: e,
        })?;
    let versions = applied(&mut *pool.acquire().await?).await?;
    check_schema(&versions, &POSTGRES_MIGRATOR)?;
    // Before the migrations: the defaults they create (`DEFAULT now()`) bind the
    // clock's `now()`.
    #[cfg(feature = "testing")]
    if manual_clock {
        clock::install(&pool, config.clock.now_ms(), versions.is_empty()).await?;
    }
    POSTGRES_MIGRATOR.run(&pool).await?;
    Ok(Postgres { pool })
}

/// The versions of the migrations applied, in order (none before the first).
pub(crate) async fn applied(c: &mut sqlx::PgConnection) -> Result<Vec<i64>> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut *c)
        .await?;
    if !exists {
        return Ok(Vec::new());
    }
    Ok(
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(&mut *c)
            .await?,
    )
}
