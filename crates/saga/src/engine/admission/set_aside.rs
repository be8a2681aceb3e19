//! Waiting starts that cannot start (their input no longer decodes, a deploy removed
//! their saga): set aside with their reason, listed, removed.

// A build with one backend leaves the other's imports and arguments unused.
#![cfg_attr(
    not(all(feature = "sqlite", feature = "postgres")),
    allow(unused_imports, unused_variables)
)]

use super::*;

/// The longest reason kept with a set-aside start, in characters.
const MAX_REASON_CHARS: usize = 2000;

/// Puts start `w` of `name`, just taken off the queue, back as set aside with `reason`:
/// same place (`seq`), id and data, passed over by admission from now on.
pub(crate) async fn set_aside(
    conn: Conn<'_>,
    name: &str,
    w: &Waiting,
    reason: &str,
    now_ms: i64,
) -> Result<()> {
    let reason: String = reason.chars().take(MAX_REASON_CHARS).collect();
    let headers = serde_json::to_string(&w.headers)?;
    agentsaga_core::match_conn!(conn, sqlite(c) => {
        sqlx::query(
            "INSERT INTO saga_starts
               (seq, id, name, data, headers, created_at, error, set_aside_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )
        .bind(w.seq)
        .bind(w.id.to_string())
        .bind(name)
        .bind(w.data.to_string())
        .bind(headers)
        .bind(w.created_ms)
        .bind(reason)
        .bind(now_ms)
        .execute(c)
        .await?;
    }, postgres(c) => {
        sqlx::query(
            "INSERT INTO saga_starts
               (seq, id, name, data, headers, created_at, error, set_aside_at)
             OVERRIDING SYSTEM VALUE
             VALUES ($1, $2, $3, $4::jsonb, $5::jsonb,
                     to_timestamp($6::double precision / 1000), $7, now())",
        )
        .bind(w.seq)
        .bind(w.id.as_uuid())
        .bind(name)
        .bind(w.data.to_string())
        .bind(headers)
        .bind(w.created_ms)
        .bind(reason)
        .execute(c)
        .await?;
    });
    Ok(())
}

/// A start set aside: what [`set_aside`] kept.
pub(crate) struct SetAsideRow {
    pub(crate) id: SagaId,
    pub(crate) name: String,
    pub(crate) data: Value,
    pub(crate) error: String,
    pub(crate) created_ms: i64,
    pub(crate) set_aside_ms: i64,
}

/// The starts set aside, oldest first; only `id`'s if given (read-only).
pub(crate) async fn set_aside_rows(store: &Store, id: Option<SagaId>) -> Result<Vec<SetAsideRow>> {
    let mut out = Vec::new();
    agentsaga_core::match_reader!(store.reader(), sqlite(reader) => {
        let rows = sqlx::query(
            "SELECT id, name, data, error, created_at, set_aside_at FROM saga_starts
             WHERE error IS NOT NULL AND (?1 IS NULL OR id = ?1) ORDER BY seq",
        )
        .bind(id.map(|id| id.to_string()))
        .fetch_all(reader)
        .await?;
        for r in rows {
            let id: String = r.try_get("id")?;
            let data: String = r.try_get("data")?;
            out.push(SetAsideRow {
                id: id
                    .parse()
                    .map_err(|e| Error::Corrupt(format!("saga_starts id `{id}`: {e}")))?,
                name: r.try_get("name")?,
                data: serde_json::from_str(&data)?,
                error: r.try_get("error")?,
                created_ms: r.try_get("created_at")?,
                set_aside_ms: r.try_get::<Option<i64>, _>("set_aside_at")?.unwrap_or_default(),
            });
        }
    }, postgres(pool) => {
        let rows = sqlx::query(
            "SELECT id, name, data::text AS data, error,
                    (extract(epoch FROM created_at) * 1000)::bigint AS created_ms,
                    (extract(epoch FROM set_aside_at) * 1000)::bigint AS set_aside_ms
             FROM saga_starts
             WHERE error IS NOT NULL AND ($1::uuid IS NULL OR id = $1) ORDER BY seq",
        )
        .bind(id.map(|id| *id.as_uuid()))
        .fetch_all(pool)
        .await?;
        for r in rows {
            let id: Uuid = r.try_get("id")?;
            let data: String = r.try_get("data")?;
            out.push(SetAsideRow {
                id: SagaId::from(id),
                name: r.try_get("name")?,
                data: serde_json::from_str(&data)?,
                error: r.try_get("error")?,
                created_ms: r.try_get("created_ms")?,
                set_aside_ms: r.try_get::<Option<i64>, _>("set_aside_ms")?.unwrap_or_default(),
            });
        }
    });
    Ok(out)
}

/// Deletes the set-aside start `id`, and the idempotency key that named it (a later
/// start with that key starts afresh). Returns whether there was one.
pub(crate) async fn remove_set_aside(conn: Conn<'_>, id: SagaId) -> Result<bool> {
    Ok(agentsaga_core::match_conn!(conn, sqlite(c) => {
        let n = sqlx::query("DELETE FROM saga_starts WHERE id = ?1 AND error IS NOT NULL")
            .bind(id.to_string())
            .execute(&mut *c)
            .await?
            .rows_affected();
        if n > 0 {
            sqlx::query("DELETE FROM saga_keys WHERE saga_id = ?1")
                .bind(id.to_string())
                .execute(&mut *c)
                .await?;
        }
        n > 0
    }, postgres(c) => {
        let n = sqlx::query("DELETE FROM saga_starts WHERE id = $1 AND error IS NOT NULL")
            .bind(id.as_uuid())
            .execute(&mut *c)
            .await?
            .rows_affected();
        if n > 0 {
            sqlx::query("DELETE FROM saga_keys WHERE saga_id = $1")
                .bind(id.as_uuid())
                .execute(&mut *c)
                .await?;
        }
        n > 0
    }))
}
