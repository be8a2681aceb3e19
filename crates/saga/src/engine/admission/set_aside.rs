//! Waiting starts that cannot start (their input no longer decodes, a deploy removed
//! their saga): set aside with their reason, listed, removed.

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
    Sql::new(
        "INSERT INTO saga_starts
           (seq, id, name, data, headers, created_at, error, set_aside_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(w.seq)
    .bind(*w.id.as_uuid())
    .bind(name)
    .bind_json(w.data.to_string().as_str())
    .bind_json(headers.as_str())
    .bind_time(w.created_ms)
    .bind(reason)
    .bind_now(now_ms)
    .execute(conn)
    .await?;
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
    let rows = Sql::new(
        "SELECT id, name, data, error, created_at, set_aside_at FROM saga_starts
         WHERE error IS NOT NULL AND (? IS NULL OR id = ?) ORDER BY seq",
    )
    .bind(id.map(|id| *id.as_uuid()))
    .bind(id.map(|id| *id.as_uuid()))
    .fetch_all(store.reader())
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(SetAsideRow {
            id: SagaId::from(r.uuid("id")?),
            name: r.text("name")?,
            data: serde_json::from_str(&r.text("data")?)?,
            error: r.text("error")?,
            created_ms: r.int("created_at")?,
            set_aside_ms: r.opt_int("set_aside_at")?.unwrap_or_default(),
        });
    }
    Ok(out)
}

/// Deletes the set-aside start `id`, and the idempotency key that named it (a later
/// start with that key starts afresh). Returns whether there was one.
pub(crate) async fn remove_set_aside(conn: Conn<'_>, id: SagaId) -> Result<bool> {
    let mut conn = conn;
    let n = Sql::new("DELETE FROM saga_starts WHERE id = ? AND error IS NOT NULL")
        .bind(*id.as_uuid())
        .execute(&mut conn)
        .await?;
    if n > 0 {
        Sql::new("DELETE FROM saga_keys WHERE saga_id = ?")
            .bind(*id.as_uuid())
            .execute(conn)
            .await?;
    }
    Ok(n > 0)
}
