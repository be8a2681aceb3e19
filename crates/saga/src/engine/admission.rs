//! Admission control's SQL: the `saga_starts` queue of starts waiting for room, and
//! the count of a saga name's sagas in flight.

use agentsaga_core::{Conn, Headers, Sql, Store};
use serde_json::Value;

use crate::{Result, SagaId};

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
    let mut conn = conn;
    let inserted = Sql::new(
        "INSERT INTO saga_keys (name, key, saga_id, created_at) VALUES (?, ?, ?, ?)
         ON CONFLICT (name, key) DO NOTHING",
    )
    .bind(name)
    .bind(key)
    .bind(*id.as_uuid())
    .bind_now(now_ms)
    .execute(&mut conn)
    .await?;
    if inserted == 1 {
        return Ok(None);
    }
    let held = Sql::new("SELECT saga_id FROM saga_keys WHERE name = ? AND key = ?")
        .bind(name)
        .bind(key)
        .fetch_one(conn)
        .await?
        .uuid("saga_id")?;
    Ok(Some(SagaId::from(held)))
}

/// Sagas of `name` in flight (running or compensating).
pub(crate) async fn in_flight(conn: Conn<'_>, name: &str) -> Result<u64> {
    let n = Sql::new(
        "SELECT count(*) AS n FROM saga_instances
         WHERE state IN ('running', 'compensating') AND name = ?",
    )
    .bind(name)
    .fetch_one(conn)
    .await?
    .int("n")?;
    Ok(n.max(0) as u64)
}

/// Are starts of `name` waiting (set-aside ones do not count: they hold nothing up)?
pub(crate) async fn any_waiting(conn: Conn<'_>, name: &str) -> Result<bool> {
    Ok(Sql::new(
        "SELECT EXISTS (SELECT 1 FROM saga_starts WHERE name = ? AND error IS NULL) AS any",
    )
    .bind(name)
    .fetch_one(conn)
    .await?
    .bool("any")?)
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
    Sql::new(
        "INSERT INTO saga_starts (id, name, data, headers, created_at) VALUES (?, ?, ?, ?, ?)",
    )
    .bind(*id.as_uuid())
    .bind(name)
    .bind_json(data.to_string().as_str())
    .bind_json(headers.as_str())
    .bind_now(now_ms)
    .execute(conn)
    .await?;
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
/// flight before them), oldest first. The caller's transaction first takes `name`'s
/// admission lock ([`Conn::lock`]), so that two processes admitting at once do not
/// both fill the same room. How long each waited is by the database's clock where it
/// has one.
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
    let _ = now_ms; // the waits are by the database's clock (this process's on SQLite)
    let mut conn = conn;
    conn.lock(&format!("agentsaga.admit:{name}")).await?;
    let in_flight = in_flight(conn.reborrow(), name).await?;
    let rows = Sql::new(
        "DELETE FROM saga_starts WHERE seq IN
               (SELECT seq FROM saga_starts WHERE name = ? AND error IS NULL
                ORDER BY seq LIMIT ?)
             RETURNING seq, id, data, headers, {now_ms} - {ms created_at} AS waited,
               {ms created_at} AS created_ms",
    )
    .bind(name)
    .bind(room(in_flight))
    .fetch_all(conn)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(Waiting {
            seq: r.int("seq")?,
            id: SagaId::from(r.uuid("id")?),
            data: serde_json::from_str(&r.text("data")?)?,
            headers: serde_json::from_str(&r.text("headers")?)?,
            waited_ms: r.int("waited")?.max(0),
            created_ms: r.int("created_ms")?,
        });
    }
    out.sort_by_key(|w| w.seq);
    Ok((in_flight, out))
}

/// Gives back the idempotency key `key` of `name`, claimed in this transaction by a
/// start that is then refused (so that the refusal writes nothing).
pub(crate) async fn release_key(conn: Conn<'_>, name: &str, key: &str) -> Result<()> {
    Sql::new("DELETE FROM saga_keys WHERE name = ? AND key = ?")
        .bind(name)
        .bind(key)
        .execute(conn)
        .await?;
    Ok(())
}

/// Waiting starts per saga name (read-only).
pub(crate) async fn waiting(store: &Store) -> Result<Vec<(String, u64)>> {
    let rows = Sql::new(
        "SELECT name, count(*) AS n FROM saga_starts WHERE error IS NULL
         GROUP BY name ORDER BY name",
    )
    .fetch_all(store.reader())
    .await?;
    rows.iter()
        .map(|r| Ok((r.text("name")?, r.int("n")?.max(0) as u64)))
        .collect()
}

/// Is `id` a start still waiting for room, not set aside (read-only)?
pub(crate) async fn is_waiting(store: &Store, id: SagaId) -> Result<bool> {
    Ok(Sql::new(
        "SELECT EXISTS (SELECT 1 FROM saga_starts WHERE id = ? AND error IS NULL) AS waiting",
    )
    .bind(*id.as_uuid())
    .fetch_one(store.reader())
    .await?
    .bool("waiting")?)
}

/// Runs `read` on a connection of the store's read pool, outside any transaction: the `_now` reads below share their SQL with the
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
