//! A manual clock on PostgreSQL (feature `testing`): the database's `now()` and
//! `clock_timestamp()` read the test's clock instead of the server's, for the store's
//! own sessions.
//!
//! PostgreSQL resolves an unqualified function through the `search_path`, and looks in
//! `pg_catalog` first only where the path does not name it. So a database under a
//! manual clock gets a schema `agentsaga_clock` with its own `now()` and
//! `clock_timestamp()`, both reading one row (`agentsaga_clock.now_ms`), and the
//! store's pool a path that names that schema before `pg_catalog`
//! ([`SEARCH_PATH`]). Every statement of the store, the relay and the engine, the
//! stored claim functions included, then runs unchanged on the test's time, and the
//! column defaults that the migrations create afterwards (`DEFAULT now()`) bind the
//! clock's `now()`. Other sessions of the database (another store on the system clock,
//! a `psql`) keep the server's time. Leases are written from
//! `pg_catalog.clock_timestamp()`, named in full, which no path shadows: as on SQLite,
//! they tell a live holder from a dead one by real time (see
//! [`Clock::lease_now`](crate::clock::Clock::lease_now)).
//!
//! The clock is installed only in a fresh database (or one that has it already): a
//! database agentsaga migrated on the server's clock is refused
//! ([`Error::ManualClockNeedsAFreshDatabase`]), so that a test pointed at a live
//! database cannot put its defaults on a test's clock. The row is moved by
//! [`Store::advance_clock`](crate::Store::advance_clock), before the process's clock,
//! so that nothing woken by the move reads the database's time behind it. One
//! database, one manual clock: give each test a database of its own.

use sqlx::postgres::PgPool;

use crate::{Error, Result};

/// The search path of a database under a manual clock.
pub(crate) const SEARCH_PATH: &str = "public,agentsaga_clock,pg_catalog";

/// Installs the manual clock in the database of `pool` (idempotent), standing at
/// `now_ms`: in a `fresh` database (no migration applied yet) or one that has it
/// already. Run before the migrations.
pub(crate) async fn install(pool: &PgPool, now_ms: i64, fresh: bool) -> Result<()> {
    let mut tx = pool.begin().await?;
    // One installer at a time (`CREATE OR REPLACE FUNCTION` races itself).
    sqlx::query("SELECT pg_advisory_xact_lock(7417301662)")
        .execute(&mut *tx)
        .await?;
    let installed: bool =
        sqlx::query_scalar("SELECT to_regnamespace('agentsaga_clock') IS NOT NULL")
            .fetch_one(&mut *tx)
            .await?;
    if !fresh && !installed {
        return Err(Error::ManualClockNeedsAFreshDatabase);
    }
    for statement in [
        "CREATE SCHEMA IF NOT EXISTS agentsaga_clock",
        "CREATE TABLE IF NOT EXISTS agentsaga_clock.now_ms (ms int8 NOT NULL)",
        "CREATE OR REPLACE FUNCTION agentsaga_clock.now() RETURNS timestamptz
             LANGUAGE sql STABLE
             AS $$ SELECT timestamptz 'epoch' + ms * interval '1 millisecond'
                     FROM agentsaga_clock.now_ms $$",
        "CREATE OR REPLACE FUNCTION agentsaga_clock.clock_timestamp() RETURNS timestamptz
             LANGUAGE sql VOLATILE
             AS $$ SELECT timestamptz 'epoch' + ms * interval '1 millisecond'
                     FROM agentsaga_clock.now_ms $$",
        "DELETE FROM agentsaga_clock.now_ms",
    ] {
        sqlx::query(statement).execute(&mut *tx).await?;
    }
    sqlx::query("INSERT INTO agentsaga_clock.now_ms (ms) VALUES ($1)")
        .bind(now_ms)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Moves the database's manual clock to `ms`.
pub(crate) async fn set(pool: &PgPool, ms: i64) -> Result<()> {
    sqlx::query("UPDATE agentsaga_clock.now_ms SET ms = $1")
        .bind(ms)
        .execute(pool)
        .await?;
    Ok(())
}
