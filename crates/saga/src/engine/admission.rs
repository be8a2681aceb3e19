//! Admission control's SQL: the `saga_starts` queue of starts waiting for room, and
//! the count of a saga name's sagas in flight, on each backend.

// A build with one backend leaves the other's imports and arguments unused.
#![cfg_attr(
    not(all(feature = "sqlite", feature = "postgres")),
    allow(unused_imports, unused_variables)
)]

use agentsaga_core::sqlx::{self, Row};
use agentsaga_core::{Conn, Headers, Store};
use serde_json::Value;
use uuid::Uuid;

use crate::{Error, Result, SagaId};

mod set_aside;

pub(crate) use set_aside::*;

/// A start taken off the queue, to be started now.
pub(crate) struct Waiting {
    pub(crate) seq: i64,
    pub(crate) id: SagaId,
    pub(crate) data: Value,
    pub(crate) headers: Headers,
    /// How long it waited, in milliseconds.
    pub(crate) waited_ms: i64,
    /// When it was accepted, Unix ms.
    pub(crate) created_ms: i64,
}

/// Claims (`name`, `key`) for saga `id`, in the caller's transaction. Returns the id
/// of the saga that holds the key already, if any (then nothing was written). Racing
/// claims take turns on the primary key: PostgreSQL makes the second wait for the
/// first's transaction, then sees its row; SQLite's single writer orders them.
pub(crate) async fn claim_key(
    conn: Conn<'_>,
    name: &str,
    key: &str,
    id: SagaId,
    now_ms: i64,
) -> Result<Option<SagaId>> {
    agentsaga_core::match_conn!(conn, sqlite(c) => {
        let inserted = sqlx::query(
            "INSERT INTO saga_keys (name, key, saga_id, created_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (name, key) DO NOTHING",
        )
        .bind(name)
        .bind(key)
        .bind(id.to_string())
        .bind(now_ms)
        .execute(&mut *c)
        .await?
        .rows_affected();
        if inserted == 1 {
            return Ok(None);
        }
        let held: String = sqlx::query_scalar(
            "SELECT saga_id FROM saga_keys WHERE name = ?1 AND key = ?2",
        )
        .bind(name)
        .bind(key)
        .fetch_one(&mut *c)
        .await?;
        Ok(Some(held.parse().map_err(|e| {
            Error::Corrupt(format!("saga_keys.saga_id `{held}`: {e}"))
        })?))
    }, postgres(c) => {
        let inserted = sqlx::query(
            "INSERT INTO saga_keys (name, key, saga_id) VALUES ($1, $2, $3)
             ON CONFLICT (name, key) DO NOTHING",
        )
        .bind(name)
        .bind(key)
        .bind(id.as_uuid())
        .execute(&mut *c)
        .await?
        .rows_affected();
        if inserted == 1 {
            return Ok(None);
        }
        let held: Uuid = sqlx::query_scalar(
            "SELECT saga_id FROM saga_keys WHERE name = $1 AND key = $2",
        )
        .bind(name)
        .bind(key)
        .fetch_one(&mut *c)
        .await?;
        Ok(Some(SagaId::from(held)))
    })
}

/// Sagas of `name` in flight (running or compensating).
pub(crate) async fn in_flight(conn: Conn<'_>, name: &str) -> Result<u64> {
    let n: i64 = agentsaga_core::match_conn!(conn, sqlite(c) => {
        sqlx::query_scalar(
            "SELECT count(*) FROM saga_instances
             WHERE state IN ('running', 'compensating') AND name = ?1",
        )
        .bind(name)
        .fetch_one(c)
        .await?
    }, postgres(c) => {
        sqlx::query_scalar(
            "SELECT count(*) FROM saga_instances
             WHERE state IN ('running', 'compensating') AND name = $1",
        )
        .bind(name)
        .fetch_one(c)
        .await?
    });
    Ok(n as u64)
}

/// Are starts of `name` waiting (set-aside ones do not count: they hold nothing up)?
pub(crate) async fn any_waiting(conn: Conn<'_>, name: &str) -> Result<bool> {
    Ok(agentsaga_core::match_conn!(conn, sqlite(c) => {
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM saga_starts WHERE name = ?1 AND error IS NULL)")
            .bind(name)
            .fetch_one(c)
            .await?
    }, postgres(c) => {
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM saga_starts WHERE name = $1 AND error IS NULL)")
            .bind(name)
            .fetch_one(c)
            .await?
    }))
}

/// Queues a start.
pub(crate) async fn push(
    conn: Conn<'_>,
    id: SagaId,
    name: &str,
    data: &Value,
    headers: &Headers,
    now_ms: i64,
) -> Result<()> {
    let headers = serde_json::to_string(headers)?;
    agentsaga_core::match_conn!(conn, sqlite(c) => {
        sqlx::query(
            "INSERT INTO saga_starts (id, name, data, headers, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .bind(id.to_string())
        .bind(name)
        .bind(data.to_string())
        .bind(headers)
        .bind(now_ms)
        .execute(c)
        .await?;
    }, postgres(c) => {
        sqlx::query(
            "INSERT INTO saga_starts (id, name, data, headers)
             VALUES ($1, $2, $3::jsonb, $4::jsonb)",
        )
        .bind(id.as_uuid())
        .bind(name)
        .bind(data.to_string())
        .bind(headers)
        .execute(c)
        .await?;
    });
    Ok(())
}

/// The least room worth an admission: starts are admitted in batches of at least a
/// tenth of the bound (up to 100), so that a busy saga name costs one admission
/// transaction per batch, not one per finished saga.
pub(crate) fn min_batch(bound: u64) -> u64 {
    (bound / 10).clamp(1, 100)
}

/// Takes as many of the oldest waiting starts of `name` off the queue as there is room
/// for under `bound`, if that is at least [`min_batch`] (returned with the count in
/// flight before them), oldest first. On
/// PostgreSQL the caller's transaction first takes `name`'s admission lock, so that two
/// processes admitting at once do not both fill the same room.
pub(crate) async fn pop(
    conn: Conn<'_>,
    name: &str,
    bound: u64,
    now_ms: i64,
) -> Result<(u64, Vec<Waiting>)> {
    let batch = i64::try_from(min_batch(bound)).unwrap_or(1);
    let bound = i64::try_from(bound).unwrap_or(i64::MAX);
    let room = |n: u64| {
        let room = bound.saturating_sub(n as i64).max(0);
        if room >= batch { room } else { 0 }
    };
    let mut out = Vec::new();
    let in_flight = agentsaga_core::match_conn!(conn, sqlite(c) => {
        let n = in_flight(Conn::Sqlite(&mut *c), name).await?;
        let rows = sqlx::query(
            "DELETE FROM saga_starts WHERE seq IN
                   (SELECT seq FROM saga_starts WHERE name = ?1 AND error IS NULL
                    ORDER BY seq LIMIT ?2)
                 RETURNING seq, id, data, headers, created_at",
        )
        .bind(name)
        .bind(room(n))
        .fetch_all(&mut *c)
        .await?;
        for r in rows {
            let id: String = r.try_get("id")?;
            let data: String = r.try_get("data")?;
            let headers: String = r.try_get("headers")?;
            let created: i64 = r.try_get("created_at")?;
            out.push(Waiting {
                seq: r.try_get("seq")?,
                id: id
                    .parse()
                    .map_err(|e| Error::Corrupt(format!("saga_starts id `{id}`: {e}")))?,
                data: serde_json::from_str(&data)?,
                headers: serde_json::from_str(&headers)?,
                waited_ms: (now_ms - created).max(0),
                created_ms: created,
            });
        }
        n
    }, postgres(c) => {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('agentsaga.admit:' || $1))")
            .bind(name)
            .execute(&mut *c)
            .await?;
        let n = in_flight(Conn::Postgres(&mut *c), name).await?;
        let rows = sqlx::query(
            "DELETE FROM saga_starts WHERE seq IN
                   (SELECT seq FROM saga_starts WHERE name = $1 AND error IS NULL
                    ORDER BY seq LIMIT $2)
                 RETURNING seq, id, data::text AS data, headers::text AS headers,
                   (extract(epoch FROM now() - created_at) * 1000)::bigint AS waited,
                   (extract(epoch FROM created_at) * 1000)::bigint AS created_ms",
        )
        .bind(name)
        .bind(room(n))
        .fetch_all(&mut *c)
        .await?;
        for r in rows {
            let id: Uuid = r.try_get("id")?;
            let data: String = r.try_get("data")?;
            let headers: String = r.try_get("headers")?;
            out.push(Waiting {
                seq: r.try_get("seq")?,
                id: SagaId::from(id),
                data: serde_json::from_str(&data)?,
                headers: serde_json::from_str(&headers)?,
                waited_ms: r.try_get::<i64, _>("waited")?.max(0),
                created_ms: r.try_get("created_ms")?,
            });
        }
        n
    });
    out.sort_by_key(|w| w.seq);
    Ok((in_flight, out))
}

/// Gives back the idempotency key `key` of `name`, claimed in this transaction by a
/// start that is then refused (so that the refusal writes nothing).
pub(crate) async fn release_key(conn: Conn<'_>, name: &str, key: &str) -> Result<()> {
    agentsaga_core::match_conn!(conn, sqlite(c) => {
        sqlx::query("DELETE FROM saga_keys WHERE name = ?1 AND key = ?2")
            .bind(name)
            .bind(key)
            .execute(c)
            .await?;
    }, postgres(c) => {
        sqlx::query("DELETE FROM saga_keys WHERE name = $1 AND key = $2")
            .bind(name)
            .bind(key)
            .execute(c)
            .await?;
    });
    Ok(())
}

/// Waiting starts per saga name (read-only).
pub(crate) async fn waiting(store: &Store) -> Result<Vec<(String, u64)>> {
    let rows: Vec<(String, i64)> = agentsaga_core::with_reader!(store.reader(), pool => {
        sqlx::query_as(
            "SELECT name, count(*) FROM saga_starts WHERE error IS NULL
             GROUP BY name ORDER BY name",
        )
            .fetch_all(pool)
            .await?
    });
    Ok(rows.into_iter().map(|(n, c)| (n, c as u64)).collect())
}

/// Is `id` a start still waiting for room, not set aside (read-only)?
pub(crate) async fn is_waiting(store: &Store, id: SagaId) -> Result<bool> {
    Ok(
        agentsaga_core::match_reader!(store.reader(), sqlite(reader) => {
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM saga_starts WHERE id = ?1 AND error IS NULL)")
                .bind(id.to_string())
                .fetch_one(reader)
                .await?
        }, postgres(pool) => {
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM saga_starts WHERE id = $1 AND error IS NULL)")
                .bind(id.as_uuid())
                .fetch_one(pool)
                .await?
        }),
    )
}

/// Runs `read` on a pooled read connection (SQLite's reader pool, or the Postgres
/// pool), outside any transaction: the `_now` reads below share their SQL with the
/// in-transaction ones.
async fn on_reader<T>(store: &Store, read: impl AsyncFnOnce(Conn<'_>) -> Result<T>) -> Result<T> {
    store.read(async |c| Ok(read(c).await)).await?
}

/// Sagas of `name` in flight (a read, outside any transaction).
pub(crate) async fn in_flight_now(store: &Store, name: &str) -> Result<u64> {
    on_reader(store, async |c| in_flight(c, name).await).await
}

/// Are starts of `name` waiting (a read, outside any transaction)?
pub(crate) async fn any_waiting_now(store: &Store, name: &str) -> Result<bool> {
    on_reader(store, async |c| any_waiting(c, name).await).await
}
