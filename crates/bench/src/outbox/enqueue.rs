//! `enqueue_single_rate` and `enqueue_batch100_rate`: the store's enqueue against a
//! plain-sqlx floor.

use agentsaga_core::Store;
use sqlx::{Postgres, QueryBuilder, Sqlite};
use uuid::Uuid;

use super::measure::parallel;
use super::plain::Plain;
use super::setup::{BATCH, DEST, key, message, now_ms, payload};

// ----- enqueue_single_rate -----------------------------------------------------------

pub(super) async fn store_single(store: &Store, n: usize, tasks: usize) -> anyhow::Result<f64> {
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

pub(super) async fn floor_single(plain: &Plain, n: usize, tasks: usize) -> anyhow::Result<f64> {
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

pub(super) async fn store_batch(
    store: &Store,
    batches: usize,
    tasks: usize,
) -> anyhow::Result<f64> {
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

pub(super) async fn floor_batch(
    plain: &Plain,
    batches: usize,
    tasks: usize,
) -> anyhow::Result<f64> {
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
