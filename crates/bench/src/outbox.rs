//! The `outbox` bench: how fast the store writes and drains the outbox, against the
//! same statements written by hand in plain sqlx (the *floor*).
//!
//! - `enqueue_single_rate`: transactions of one message each (`store.begin()`,
//!   `tx.enqueue`, `tx.commit()`); floor: the same INSERT in a plain sqlx transaction.
//! - `enqueue_batch100_rate`: transactions of 100 messages (`tx.enqueue_batch`); floor:
//!   one hand-written multi-row `INSERT … VALUES (…), (…), …` per transaction.
//! - `drain_rate`: a keyed backlog (1000 keys, round-robin) drained by `store.claim` of
//!   100 then `store.mark_delivered`, one claimer; floor: `UPDATE … RETURNING` of the
//!   100 oldest ready rows plus one `UPDATE` marking them delivered, *without* the
//!   per-key `NOT EXISTS` check (so without per-key order).
//!
//! Concurrency is 1 on SQLite (the store has one writer connection) and 8 tasks on
//! PostgreSQL, for the store and its floor alike. Each figure is the median of a few
//! rounds; store and floor alternate which runs first.

use std::future::Future;
use std::time::{Duration, Instant};

use agentsaga_core::queue::Claim;
use agentsaga_core::{Message, Store};
use anyhow::{Context, ensure};
use sqlx::{Connection, PgPool, Postgres, QueryBuilder, Sqlite, SqlitePool};
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::Common;
use crate::db::{self, Backend, Scratch};
use crate::report::{Figure, Report};

const BENCH: &str = "outbox";
/// Every message goes here.
pub(crate) const DEST: &str = "bench";
/// Distinct ordering keys, assigned round-robin.
pub(crate) const KEYS: usize = 1000;
/// Messages per batch transaction, and rows per claim.
pub(crate) const BATCH: usize = 100;
/// The claimer's lease owner name.
pub(crate) const OWNER: &str = "bench-relay";
/// A lease long enough never to expire during a run.
pub(crate) const LEASE: Duration = Duration::from_secs(600);
/// Messages per transaction when filling a backlog (untimed).
const FILL_CHUNK: usize = 1000;

/// `outbox` options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: Common,
}

/// How much work each figure does.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Single-message transactions per round.
    single: usize,
    /// 100-message transactions per round.
    batches: usize,
    /// Backlog rows drained per round.
    backlog: usize,
    /// Rounds per figure (the median is reported).
    rounds: usize,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                single: 2_000,
                batches: 100,
                backlog: 10_000,
                rounds: 1,
            }
        } else {
            Self {
                single: 10_000,
                batches: 500,
                backlog: 100_000,
                rounds: 3,
            }
        }
    }
}

/// Concurrent writers: SQLite has one writer anyway; PostgreSQL gets 8.
fn concurrency(backend: Backend) -> usize {
    match backend {
        Backend::Sqlite => 1,
        Backend::Postgres => 8,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    Single,
    Batch,
    Drain,
}

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Self::Single => "enqueue_single_rate",
            Self::Batch => "enqueue_batch100_rate",
            Self::Drain => "drain_rate",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Store,
    Floor,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Self::Store => "store",
            Self::Floor => "floor",
        }
    }
}

/// A plain sqlx pool of either backend, for the floors.
#[derive(Debug, Clone)]
pub(crate) enum Plain {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl Plain {
    pub(crate) async fn open(backend: Backend, url: &str) -> anyhow::Result<Self> {
        Ok(match backend {
            Backend::Sqlite => Self::Sqlite(db::plain_sqlite(url).await?),
            Backend::Postgres => Self::Postgres(db::plain_postgres(url).await?),
        })
    }

    pub(crate) async fn close(&self) {
        match self {
            Self::Sqlite(p) => p.close().await,
            Self::Postgres(p) => p.close().await,
        }
    }

    /// Every saga's `(state, created_at, updated_at)`, times in Unix ms: what the saga
    /// benches check and measure once a run is over.
    pub(crate) async fn saga_rows(&self) -> anyhow::Result<Vec<(String, i64, i64)>> {
        Ok(match self {
            Self::Sqlite(pool) => {
                sqlx::query_as("SELECT state, created_at, updated_at FROM saga_instances")
                    .fetch_all(pool)
                    .await?
            }
            Self::Postgres(pool) => {
                sqlx::query_as(
                    "SELECT state, (extract(epoch FROM created_at) * 1000)::bigint,
                        (extract(epoch FROM updated_at) * 1000)::bigint
                     FROM saga_instances",
                )
                .fetch_all(pool)
                .await?
            }
        })
    }
}

/// Runs the `outbox` bench on the chosen backends.
pub(crate) async fn run(args: &Args, scratch: &mut Scratch) -> anyhow::Result<Report> {
    let sizes = Sizes::new(args.common.quick);
    let started = Instant::now();
    let mut report = Report::default();
    for backend in args.common.backend.backends() {
        report.notes.push(scratch.describe(backend).await?);
        for metric in [Metric::Single, Metric::Batch, Metric::Drain] {
            let (value, floor) = figure(backend, metric, sizes, scratch)
                .await
                .with_context(|| format!("{} {}", backend.name(), metric.name()))?;
            report.figures.push(Figure::rate(
                BENCH,
                backend.name(),
                metric.name(),
                value,
                floor,
            ));
        }
    }
    let rounds = if sizes.rounds == 1 {
        "one round (--quick: a smoke run, not a measurement)".to_owned()
    } else {
        format!(
            "median of {} rounds, store and floor alternating which runs first",
            sizes.rounds
        )
    };
    report.notes.extend([
        format!(
            "method: {rounds}; every floor runs in its own fresh database with the same \
             migrations; concurrency 1 on sqlite, 8 tasks on postgres (pools of 16), for \
             store and floor alike"
        ),
        format!(
            "enqueue: {} one-message transactions and {} transactions of {BATCH} messages \
             per round, ~60-byte JSON payloads, 1000 keys",
            sizes.single, sizes.batches
        ),
        format!(
            "drain: a backlog of {} rows over {KEYS} keys round-robin, filled untimed in a \
             template database (then VACUUM ANALYZE on postgres, a WAL checkpoint on \
             sqlite), each drain on a fresh copy of it; claims of {BATCH} + mark \
             delivered, one claimer; the floor skips the per-key NOT EXISTS check, so it \
             does not keep per-key order",
            sizes.backlog
        ),
        format!(
            "whole run: {:.1} s; ratio = value / floor, target >= {}",
            started.elapsed().as_secs_f64(),
            crate::report::TARGET_RATIO
        ),
    ]);
    Ok(report)
}

/// Measures one figure: (store median, floor median), in msgs/s.
async fn figure(
    backend: Backend,
    metric: Metric,
    sizes: Sizes,
    scratch: &mut Scratch,
) -> anyhow::Result<(f64, f64)> {
    // Enqueue figures reuse one database per side across rounds. The drain needs a
    // fresh backlog per round and side: copies of one filled template, so that every
    // drain starts from the same rows.
    let mut enqueue_dbs = None;
    let mut backlog_template = None;
    match metric {
        Metric::Single | Metric::Batch => {
            let store = Store::connect(&scratch.fresh_url(backend).await?).await?;
            let plain = Plain::open(backend, &scratch.fresh_url(backend).await?).await?;
            enqueue_dbs = Some((store, plain));
        }
        Metric::Drain => {
            let url = scratch.fresh_url(backend).await?;
            fill(&url, sizes.backlog).await?;
            settle(backend, &url).await?;
            backlog_template = Some(url);
        }
    }
    let tasks = concurrency(backend);
    let mut rates = (Vec::new(), Vec::new());
    for round in 0..sizes.rounds {
        let order = if round % 2 == 0 {
            [Side::Floor, Side::Store]
        } else {
            [Side::Store, Side::Floor]
        };
        for side in order {
            let rate = match (&enqueue_dbs, metric, side) {
                (Some((store, _)), Metric::Single, Side::Store) => {
                    store_single(store, sizes.single, tasks).await?
                }
                (Some((_, plain)), Metric::Single, Side::Floor) => {
                    floor_single(plain, sizes.single, tasks).await?
                }
                (Some((store, _)), Metric::Batch, Side::Store) => {
                    store_batch(store, sizes.batches, tasks).await?
                }
                (Some((_, plain)), Metric::Batch, Side::Floor) => {
                    floor_batch(plain, sizes.batches, tasks).await?
                }
                (_, Metric::Drain, side) => {
                    let template = backlog_template.as_deref().context("no backlog")?;
                    let url = scratch.copy_of(backend, template).await?;
                    match side {
                        Side::Store => store_drain(&url, sizes.backlog).await?,
                        Side::Floor => floor_drain(backend, &url, sizes.backlog).await?,
                    }
                }
                (None, _, _) => unreachable!("enqueue figures have their databases"),
            };
            eprintln!(
                "{:<8} {:<22} round {}/{}  {:<5} {:>10.0} msgs/s",
                backend.name(),
                metric.name(),
                round + 1,
                sizes.rounds,
                side.name(),
                rate
            );
            match side {
                Side::Store => rates.0.push(rate),
                Side::Floor => rates.1.push(rate),
            }
        }
    }
    if let Some((store, plain)) = enqueue_dbs {
        store.close().await;
        plain.close().await;
    }
    Ok((median(rates.0), median(rates.1)))
}

pub(crate) fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => 0.0,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

pub(crate) fn key(i: usize) -> String {
    format!("key-{:04}", i % KEYS)
}

fn payload(i: usize) -> serde_json::Value {
    serde_json::json!({ "order": i, "amount_cents": 4200, "currency": "EUR", "note": "bench" })
}

fn message(i: usize) -> anyhow::Result<Message> {
    Ok(Message::to(DEST).key(key(i)).json(&payload(i))?)
}

/// Unix milliseconds, the SQLite schema's clock.
pub(crate) use agentsaga_core::clock::now_ms;

/// Runs `units` units of work split over `tasks` tasks; `work(task, count)` does
/// `count` units, numbering them `task, task + tasks, …`. Returns units × `per_unit`
/// per second.
async fn parallel<F, Fut>(
    tasks: usize,
    units: usize,
    per_unit: usize,
    work: F,
) -> anyhow::Result<f64>
where
    F: Fn(usize, usize) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let start = Instant::now();
    let mut set = JoinSet::new();
    for t in 0..tasks {
        let count = units / tasks + usize::from(t < units % tasks);
        set.spawn(work(t, count));
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    Ok((units * per_unit) as f64 / start.elapsed().as_secs_f64())
}

// ----- enqueue_single_rate -----------------------------------------------------------

async fn store_single(store: &Store, n: usize, tasks: usize) -> anyhow::Result<f64> {
    parallel(tasks, n, 1, |t, count| {
        let store = store.clone();
        async move {
            for j in 0..count {
                let mut tx = store.begin().await?;
                tx.enqueue(&message(j * tasks + t)?).await?;
                tx.commit().await?;
            }
            Ok(())
        }
    })
    .await
}

const SQLITE_INSERT: &str =
    "INSERT INTO outbox (id, destination, key, payload, headers, available_at, created_at)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
     ON CONFLICT (id) DO NOTHING";

const PG_INSERT: &str = "INSERT INTO outbox (id, destination, key, payload, headers, available_at)
     VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, now())
     ON CONFLICT (id) DO NOTHING";

async fn floor_single(plain: &Plain, n: usize, tasks: usize) -> anyhow::Result<f64> {
    parallel(tasks, n, 1, |t, count| {
        let plain = plain.clone();
        async move {
            for j in 0..count {
                let i = j * tasks + t;
                let payload = serde_json::to_string(&payload(i))?;
                match &plain {
                    Plain::Sqlite(pool) => {
                        let now = now_ms();
                        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                        sqlx::query(SQLITE_INSERT)
                            .bind(Uuid::now_v7().to_string())
                            .bind(DEST)
                            .bind(key(i))
                            .bind(payload)
                            .bind("{}")
                            .bind(now)
                            .bind(now)
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                    }
                    Plain::Postgres(pool) => {
                        let mut tx = pool.begin().await?;
                        sqlx::query(PG_INSERT)
                            .bind(Uuid::now_v7())
                            .bind(DEST)
                            .bind(key(i))
                            .bind(payload)
                            .bind("{}")
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                    }
                }
            }
            Ok(())
        }
    })
    .await
}

// ----- enqueue_batch100_rate ---------------------------------------------------------

async fn store_batch(store: &Store, batches: usize, tasks: usize) -> anyhow::Result<f64> {
    parallel(tasks, batches, BATCH, |t, count| {
        let store = store.clone();
        async move {
            for j in 0..count {
                let first = (j * tasks + t) * BATCH;
                let msgs = (first..first + BATCH)
                    .map(message)
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let mut tx = store.begin().await?;
                tx.enqueue_batch(&msgs).await?;
                tx.commit().await?;
            }
            Ok(())
        }
    })
    .await
}

async fn floor_batch(plain: &Plain, batches: usize, tasks: usize) -> anyhow::Result<f64> {
    parallel(tasks, batches, BATCH, |t, count| {
        let plain = plain.clone();
        async move {
            for j in 0..count {
                let first = (j * tasks + t) * BATCH;
                let rows = (first..first + BATCH)
                    .map(|i| Ok((Uuid::now_v7(), key(i), serde_json::to_string(&payload(i))?)))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                match &plain {
                    Plain::Sqlite(pool) => {
                        let now = now_ms();
                        let mut q = QueryBuilder::<Sqlite>::new(
                            "INSERT INTO outbox \
                             (id, destination, key, payload, headers, available_at, created_at) ",
                        );
                        q.push_values(rows, |mut b, (id, key, payload)| {
                            b.push_bind(id.to_string())
                                .push_bind(DEST)
                                .push_bind(key)
                                .push_bind(payload)
                                .push_bind("{}")
                                .push_bind(now)
                                .push_bind(now);
                        });
                        q.push(" ON CONFLICT (id) DO NOTHING");
                        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                        q.build().execute(&mut *tx).await?;
                        tx.commit().await?;
                    }
                    Plain::Postgres(pool) => {
                        let mut q = QueryBuilder::<Postgres>::new(
                            "INSERT INTO outbox \
                             (id, destination, key, payload, headers, available_at) ",
                        );
                        q.push_values(rows, |mut b, (id, key, payload)| {
                            b.push_bind(id)
                                .push_bind(DEST)
                                .push_bind(key)
                                .push_bind(payload)
                                .push_unseparated("::jsonb")
                                .push_bind("{}")
                                .push_unseparated("::jsonb")
                                .push("now()");
                        });
                        q.push(" ON CONFLICT (id) DO NOTHING");
                        let mut tx = pool.begin().await?;
                        q.build().execute(&mut *tx).await?;
                        tx.commit().await?;
                    }
                }
            }
            Ok(())
        }
    })
    .await
}

// ----- drain_rate ----------------------------------------------------------------------

/// Writes a backlog of `n` messages over [`KEYS`] keys round-robin, in transactions of
/// [`FILL_CHUNK`], through the store (so both sides get the same rows).
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
pub(crate) async fn settle(backend: Backend, url: &str) -> anyhow::Result<()> {
    match backend {
        Backend::Sqlite => {
            let pool = db::plain_sqlite(url).await?;
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&pool)
                .await?;
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

async fn store_drain(url: &str, backlog: usize) -> anyhow::Result<f64> {
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
    ensure!(
        delivered == backlog as u64,
        "the store drained {delivered} of {backlog} rows"
    );
    Ok(backlog as f64 / elapsed.as_secs_f64())
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

async fn floor_drain(backend: Backend, url: &str, backlog: usize) -> anyhow::Result<f64> {
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
    ensure!(
        delivered == backlog as u64,
        "the floor drained {delivered} of {backlog} rows"
    );
    Ok(backlog as f64 / elapsed.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }

    #[test]
    fn keys_cycle_over_a_thousand() {
        assert_eq!(key(0), key(KEYS));
        assert_ne!(key(0), key(1));
    }
}
