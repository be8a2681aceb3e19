//! `drain_rate`: a keyed backlog claimed and marked delivered, the store's claim against
//! a plain-sqlx floor; and the backlog's fill, shared with the relay bench.

use std::time::{Duration, Instant};

use agentsaga_core::Store;
use agentsaga_core::queue::Claim;
use anyhow::ensure;
use sqlx::Connection;
use uuid::Uuid;

use super::plain::Plain;
use super::setup::{BATCH, DEST, FILL_CHUNK, LEASE, OWNER, message, now_ms};
use crate::db::{self, Backend};

// ----- drain_rate ----------------------------------------------------------------------

/// Writes a backlog of `n` messages over [`KEYS`](super::setup::KEYS) keys round-robin,
/// in transactions of [`FILL_CHUNK`], through the store (so both sides get the same
/// rows).
pub(crate) async fn fill(url: &str, n: usize) -> anyhow::Result<()> {
    let store = Store::connect(url).await?;
    for first in (0..n).step_by(FILL_CHUNK) {
        let msgs = (first..(first + FILL_CHUNK).min(n))
            .map(message)
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut tx = store.begin().await?;
        tx.enqueue_batch(&msgs).await?;
        tx.commit().await?;
    }
    store.close().await;
    Ok(())
}

/// After the fill, before the copies: fresh planner statistics and a visibility map on
/// PostgreSQL (instead of an autovacuum at a random moment during a drain), and no
/// session left on the template (the store's LISTEN connection goes away within a
/// second of the store); everything in the main file on SQLite.
pub(crate) async fn prepare_template(backend: Backend, url: &str) -> anyhow::Result<()> {
    match backend {
        Backend::Sqlite => {
            // The template is copied as its main file alone (`Scratch::copy_of`): every
            // page must be in it. A checkpoint that another connection holds back
            // (`busy`, or frames left in the log) leaves pages in the WAL, and a copy
            // of the main file alone is then a corrupt database or one missing rows:
            // try again until it is complete.
            let pool = db::plain_sqlite(url).await?;
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let (busy, log, done): (i64, i64, i64) =
                    sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
                        .fetch_one(&pool)
                        .await?;
                if busy == 0 && log <= 0 && done <= 0 {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "the backlog template's checkpoint stays incomplete \
                     (busy {busy}, {log} frames in the log, {done} checkpointed)"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            pool.close().await;
        }
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(url).await?;
            sqlx::query("VACUUM ANALYZE outbox")
                .execute(&mut conn)
                .await?;
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let others: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                )
                .fetch_one(&mut conn)
                .await?;
                if others == 0 {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "{others} sessions still use the backlog template"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            conn.close().await?;
        }
    }
    Ok(())
}

pub(super) async fn store_drain(url: &str, backlog: usize) -> anyhow::Result<f64> {
    let store = Store::connect(url).await?;
    let destinations = vec![DEST.to_owned()];
    let claim = Claim {
        owner: OWNER,
        destinations: &destinations,
        limit: BATCH as u32,
        lease: LEASE,
    };
    let start = Instant::now();
    let mut delivered = 0u64;
    loop {
        let batch = store.queue().claim(&claim).await?;
        if batch.is_empty() {
            break;
        }
        let seqs: Vec<i64> = batch.iter().map(|e| e.seq).collect();
        delivered += store.queue().mark_delivered(OWNER, &seqs).await?;
    }
    let elapsed = start.elapsed();
    store.close().await;
    drain_rate("the store", delivered, backlog, elapsed)
}

const SQLITE_CLAIM: &str = "UPDATE outbox
     SET state = 'in_flight', lease_owner = ?1, lease_until = ?2, attempts = attempts + 1
     WHERE seq IN (
         SELECT seq FROM outbox
         WHERE state = 'pending' AND available_at <= ?3 AND destination = ?4
         ORDER BY seq
         LIMIT ?5)
     RETURNING seq, id, destination, key, payload, headers, attempts, created_at";

const SQLITE_DELIVERED: &str = "UPDATE outbox
     SET state = 'delivered', delivered_at = ?1, lease_owner = NULL, lease_until = NULL
     WHERE seq IN (SELECT value FROM json_each(?2))
       AND state = 'in_flight' AND lease_owner = ?3";

const PG_CLAIM: &str = "UPDATE outbox o
     SET state = 'in_flight', lease_owner = $1,
         lease_until = now() + $2 * interval '1 millisecond', attempts = o.attempts + 1
     WHERE o.seq IN (
         SELECT seq FROM outbox
         WHERE state = 'pending' AND available_at <= now() AND destination = $3
         ORDER BY seq
         LIMIT $4
         FOR UPDATE SKIP LOCKED)
     RETURNING o.seq, o.id, o.destination, o.key, o.payload::text, o.headers::text,
         o.attempts, (extract(epoch FROM o.created_at) * 1000)::bigint";

const PG_DELIVERED: &str = "UPDATE outbox
     SET state = 'delivered', delivered_at = now(), lease_owner = NULL, lease_until = NULL
     WHERE seq = ANY($1) AND state = 'in_flight' AND lease_owner = $2";

type SqliteClaimed = (
    i64,
    String,
    String,
    Option<String>,
    String,
    String,
    i64,
    i64,
);
type PgClaimed = (i64, Uuid, String, Option<String>, String, String, i32, i64);

pub(super) async fn floor_drain(
    backend: Backend,
    url: &str,
    backlog: usize,
) -> anyhow::Result<f64> {
    floor_drain_with(backend, url, backlog, SQLITE_CLAIM, PG_CLAIM).await
}

/// The floor's drain loop with the given claim statements (same parameters and
/// columns as [`SQLITE_CLAIM`] and [`PG_CLAIM`]): claim [`BATCH`], mark them delivered,
/// until nothing is left. Returns msgs/s.
pub(crate) async fn floor_drain_with(
    backend: Backend,
    url: &str,
    backlog: usize,
    sqlite_claim: &'static str,
    pg_claim: &'static str,
) -> anyhow::Result<f64> {
    let plain = Plain::open(backend, url).await?;
    let lease_ms = LEASE.as_millis() as i64;
    let start = Instant::now();
    let mut delivered = 0u64;
    loop {
        let mut seqs: Vec<i64> = match &plain {
            Plain::Sqlite(pool) => {
                let now = now_ms();
                let rows: Vec<SqliteClaimed> = sqlx::query_as(sqlite_claim)
                    .bind(OWNER)
                    .bind(now + lease_ms)
                    .bind(now)
                    .bind(DEST)
                    .bind(BATCH as i64)
                    .fetch_all(pool)
                    .await?;
                rows.iter().map(|r| r.0).collect()
            }
            Plain::Postgres(pool) => {
                let rows: Vec<PgClaimed> = sqlx::query_as(pg_claim)
                    .bind(OWNER)
                    .bind(lease_ms)
                    .bind(DEST)
                    .bind(BATCH as i64)
                    .fetch_all(pool)
                    .await?;
                rows.iter().map(|r| r.0).collect()
            }
        };
        if seqs.is_empty() {
            break;
        }
        // RETURNING promises no order: deliver oldest first, as the store does.
        seqs.sort_unstable();
        delivered += match &plain {
            Plain::Sqlite(pool) => sqlx::query(SQLITE_DELIVERED)
                .bind(now_ms())
                .bind(serde_json::to_string(&seqs)?)
                .bind(OWNER)
                .execute(pool)
                .await?
                .rows_affected(),
            Plain::Postgres(pool) => sqlx::query(PG_DELIVERED)
                .bind(&seqs)
                .bind(OWNER)
                .execute(pool)
                .await?
                .rows_affected(),
        };
    }
    let elapsed = start.elapsed();
    plain.close().await;
    drain_rate("the floor", delivered, backlog, elapsed)
}

/// Rows a second of a drain of `backlog` rows that took `elapsed`, once `who` is seen
/// to have delivered them all.
fn drain_rate(who: &str, delivered: u64, backlog: usize, elapsed: Duration) -> anyhow::Result<f64> {
    ensure!(
        delivered == backlog as u64,
        "{who} drained {delivered} of {backlog} rows"
    );
    Ok(backlog as f64 / elapsed.as_secs_f64())
}
