//! A manual clock on PostgreSQL (feature `testing`): the database's `now()` and
//! `clock_timestamp()` read the test's clock instead of the server's.
//!
//! PostgreSQL resolves an unqualified function through the `search_path`, and looks in
//! `pg_catalog` first only where the path does not name it. So a database under a
//! manual clock gets a schema `agentsaga_clock` with its own `now()` and `clock_timestamp()`,
//! both reading one row (`agentsaga_clock.now_ms`), and a path that names that schema
//! before `pg_catalog` (for every session of the database, and for the store's pool
//! at once). Every statement of the store, the relay and the engine, the stored claim
//! functions included, then runs unchanged on the test's time; column defaults, which
//! bind their function when created, are bound again. Leases read
//! `statement_timestamp()`, which stays the server's: as on SQLite, they tell a live
//! holder from a dead one by real time (see [`Clock::lease_now`](crate::clock::Clock::lease_now)).
//!
//! The row is moved by [`Store::advance_clock`](crate::Store::advance_clock), before
//! the process's clock, so that nothing woken by the move reads the database's time
//! behind it. One database, one manual clock: give each test a database of its own.

use sqlx::postgres::PgPool;

use crate::Result;

/// The search path of a database under a manual clock.
pub(crate) const SEARCH_PATH: &str = "public,agentsaga_clock,pg_catalog";

/// Installs the manual clock in the database of `pool` (idempotent), standing at
/// `now_ms`. Run before the migrations (so that the defaults they create bind the
/// clock's `now()`) and again after them ([`rebind_defaults`]).
pub(crate) async fn install(pool: &PgPool, now_ms: i64) -> Result<()> {
    let mut tx = pool.begin().await?;
    // One installer at a time (`CREATE OR REPLACE FUNCTION` races itself).
    sqlx::query("SELECT pg_advisory_xact_lock(7417301662)")
        .execute(&mut *tx)
        .await?;
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
        "DO $$ BEGIN
             EXECUTE format('ALTER DATABASE %I SET search_path = public, agentsaga_clock, pg_catalog',
                            current_database());
         END $$",
    ] {
        sqlx::query(statement).execute(&mut *tx).await?;
    }
    sqlx::query("DELETE FROM agentsaga_clock.now_ms")
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO agentsaga_clock.now_ms (ms) VALUES ($1)")
        .bind(now_ms)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Binds again, to the manual clock, every column default of the current schema that
/// calls the server's `now()` or `clock_timestamp()` (a database migrated before its
/// clock was installed). Run on a connection whose path names `agentsaga_clock`.
pub(crate) async fn rebind_defaults(pool: &PgPool) -> Result<()> {
    sqlx::query(
        "DO $$ DECLARE d record; BEGIN
             FOR d IN
                 SELECT c.relname AS t, a.attname AS col,
                        replace(pg_get_expr(ad.adbin, ad.adrelid), 'pg_catalog.', '') AS e
                   FROM pg_attrdef ad
                   JOIN pg_class c ON c.oid = ad.adrelid
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   JOIN pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum
                  WHERE n.nspname = current_schema()
                    AND (pg_get_expr(ad.adbin, ad.adrelid) LIKE '%pg_catalog.now()%'
                      OR pg_get_expr(ad.adbin, ad.adrelid) LIKE '%pg_catalog.clock_timestamp()%')
             LOOP
                 EXECUTE format('ALTER TABLE %I ALTER COLUMN %I SET DEFAULT %s', d.t, d.col, d.e);
             END LOOP;
         END $$",
    )
    .execute(pool)
    .await?;
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
