//! SQLite's statements: the store's [`Dialect`].

use std::time::Duration;

use sqlx::{Row, SqliteConnection};

use super::Sqlite;
use crate::clock::millis;
use crate::store::admin_types::{DeadQuery, DeadRow, Stats, Table};
use crate::store::backend::{Dialect, dead_row, envelope, within_bytes};
use crate::store::queue_types::{Claim, DeadLetter, Retry};
use crate::{Envelope, Message, MessageId, Result};

pub(crate) fn seq_list(seqs: &[i64]) -> String {
    serde_json::to_string(seqs).unwrap_or_else(|_| "[]".into())
}

impl Dialect for Sqlite {
    type Conn = SqliteConnection;

    async fn count_pending(c: &mut SqliteConnection, limit: u64) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT 1 FROM outbox WHERE state = 'pending' LIMIT ?1)",
        )
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_one(c)
        .await?;
        Ok(n as u64)
    }

    async fn enqueue_leased(
        c: &mut SqliteConnection,
        m: &Message,
        owner: &str,
        lease: Duration,
        now: i64,
        lease_now: i64,
    ) -> Result<Option<Envelope>> {
        let row = sqlx::query(
            "INSERT INTO outbox (id, destination, key, payload, headers, available_at, created_at,
                                 state, attempts, lease_owner, lease_until)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?6, 'in_flight', 1, ?7, ?8
             WHERE ?3 IS NULL OR NOT EXISTS (SELECT 1 FROM outbox
                 WHERE key = ?3 AND state IN ('pending', 'in_flight'))
             ON CONFLICT (id) DO NOTHING
             RETURNING seq, id, destination, key, payload, headers, attempts, created_at",
        )
        .bind(m.id)
        .bind(&m.destination)
        .bind(m.key.as_deref())
        .bind(&m.payload)
        .bind(m.headers_json()?)
        .bind(now)
        .bind(owner)
        .bind(lease_now.saturating_add(millis(lease)))
        .fetch_optional(c)
        .await?;
        row.as_ref().map(envelope).transpose()
    }

    async fn enqueue(c: &mut SqliteConnection, messages: &[Message], now: i64) -> Result<()> {
        // Multi-row VALUES, at most 100 rows per statement (700 parameters, far below
        // SQLite's limit): the text depends only on the chunk's size, so the statement
        // cache holds at most 100 of them. Faster than unpacking a JSON array in SQL.
        for chunk in messages.chunks(100) {
            let mut sql = String::from(
                "INSERT INTO outbox (id, destination, key, payload, headers, available_at, created_at) VALUES ",
            );
            for i in 0..chunk.len() {
                if i > 0 {
                    sql.push(',');
                }
                sql.push_str("(?, ?, ?, ?, ?, ?, ?)");
            }
            sql.push_str(" ON CONFLICT (id) DO NOTHING");
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for m in chunk {
                q = q
                    .bind(m.id)
                    .bind(&m.destination)
                    .bind(m.key.as_deref())
                    .bind(&m.payload)
                    .bind(m.headers_json()?)
                    .bind(now.saturating_add(m.delay_ms()))
                    .bind(now);
            }
            q.execute(&mut *c).await?;
        }
        Ok(())
    }

    async fn receive(
        c: &mut SqliteConnection,
        consumer: &str,
        id: MessageId,
        now_ms: i64,
    ) -> Result<bool> {
        let r = sqlx::query(
            "INSERT INTO inbox (consumer, message_id, received_at) VALUES (?1, ?2, ?3)
             ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(id)
        .bind(now_ms)
        .execute(c)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn cancel_pending(c: &mut SqliteConnection, ids: &[MessageId]) -> Result<u64> {
        let list: Vec<String> = ids.iter().map(ToString::to_string).collect();
        let r = sqlx::query(
            "DELETE FROM outbox WHERE state = 'pending' AND id IN (SELECT value FROM json_each(?1))",
        )
        .bind(serde_json::to_string(&list)?)
        .execute(c)
        .await?;
        Ok(r.rows_affected())
    }

    async fn dead_letter(
        c: &mut SqliteConnection,
        owner: &str,
        dead: &[DeadLetter],
    ) -> Result<u64> {
        let list: Vec<_> = dead
            .iter()
            .map(|d| serde_json::json!([d.seq, d.reason]))
            .collect();
        let r = sqlx::query(
            "UPDATE outbox
             SET state = 'dead', last_error = u.reason, lease_owner = NULL, lease_until = NULL
             FROM (SELECT json_extract(value, '$[0]') AS seq, json_extract(value, '$[1]') AS reason
                   FROM json_each(?1)) AS u
             WHERE outbox.seq = u.seq AND outbox.state = 'in_flight' AND outbox.lease_owner = ?2",
        )
        .bind(serde_json::Value::Array(list).to_string())
        .bind(owner)
        .execute(c)
        .await?;
        Ok(r.rows_affected())
    }

    async fn enqueue_dead(
        c: &mut SqliteConnection,
        m: &Message,
        reason: &str,
        now_ms: i64,
    ) -> Result<bool> {
        let r = sqlx::query(
            "INSERT INTO outbox (id, destination, key, payload, headers, state, last_error,
                                 available_at, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 'dead', ?6, ?7, ?7)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(m.id)
        .bind(&m.destination)
        .bind(m.key.as_deref())
        .bind(&m.payload)
        .bind(m.headers_json()?)
        .bind(reason)
        .bind(now_ms)
        .execute(c)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn seen(&self, consumer: &str, id: MessageId) -> Result<bool> {
        let row = sqlx::query("SELECT 1 FROM inbox WHERE consumer = ?1 AND message_id = ?2")
            .bind(consumer)
            .bind(id)
            .fetch_optional(&self.reader)
            .await?;
        Ok(row.is_some())
    }

    async fn claim(&self, claim: &Claim<'_>) -> Result<Vec<Envelope>> {
        Sqlite::claim_on(
            &mut *self.writer.acquire().await?,
            claim,
            super::ClaimTimes::of(&self.clock),
        )
        .await
    }

    async fn ack_and_claim(
        &self,
        delivered: &[i64],
        claim: &Claim<'_>,
    ) -> Result<(u64, Vec<Envelope>)> {
        // Two statements on the single writer, each its own transaction: an explicit
        // transaction around them costs two more trips to the connection's worker thread
        // than the commit it saves (measured).
        let n = self.mark_delivered(claim.owner, delivered).await?;
        Ok((n, self.claim(claim).await?))
    }

    async fn mark_delivered(&self, owner: &str, seqs: &[i64]) -> Result<u64> {
        Sqlite::mark_delivered_on(
            &mut *self.writer.acquire().await?,
            owner,
            seqs,
            self.clock.now_ms(),
        )
        .await
    }

    async fn retry_later(&self, owner: &str, retries: &[Retry]) -> Result<u64> {
        let list: Vec<_> = retries
            .iter()
            .map(|r| serde_json::json!([r.seq, millis(r.delay), r.error, i32::from(r.spent)]))
            .collect();
        let r = sqlx::query(
            "UPDATE outbox
             SET state = 'pending', available_at = ?1 + u.delay, last_error = u.error,
                 lease_owner = NULL, lease_until = NULL,
                 attempts = CASE WHEN u.spent = 0 THEN max(attempts - 1, 0) ELSE attempts END
             FROM (SELECT json_extract(value, '$[0]') AS seq, json_extract(value, '$[1]') AS delay,
                          json_extract(value, '$[2]') AS error, json_extract(value, '$[3]') AS spent
                   FROM json_each(?2)) AS u
             WHERE outbox.seq = u.seq AND outbox.state = 'in_flight' AND outbox.lease_owner = ?3",
        )
        .bind(self.clock.now_ms())
        .bind(serde_json::Value::Array(list).to_string())
        .bind(owner)
        .execute(&self.writer)
        .await?;
        Ok(r.rows_affected())
    }

    async fn release(&self, owner: &str, seqs: &[i64]) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE outbox
             SET state = 'pending', attempts = max(attempts - 1, 0),
                 lease_owner = NULL, lease_until = NULL
             WHERE seq IN (SELECT value FROM json_each(?1))
               AND state = 'in_flight' AND lease_owner = ?2",
        )
        .bind(seq_list(seqs))
        .bind(owner)
        .execute(&self.writer)
        .await?;
        Ok(r.rows_affected())
    }

    async fn renew(&self, owner: &str, seqs: &[i64], lease: Duration) -> Result<Vec<i64>> {
        let renewed = sqlx::query_scalar(
            "UPDATE outbox SET lease_until = ?1
             WHERE seq IN (SELECT value FROM json_each(?2))
               AND state = 'in_flight' AND lease_owner = ?3
             RETURNING seq",
        )
        .bind(self.clock.lease_now_ms().saturating_add(millis(lease)))
        .bind(seq_list(seqs))
        .bind(owner)
        .fetch_all(&self.writer)
        .await?;
        Ok(renewed)
    }

    async fn reclaim_expired(&self) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE outbox SET state = 'pending', lease_owner = NULL, lease_until = NULL
             WHERE state = 'in_flight' AND lease_until < ?1",
        )
        .bind(self.clock.lease_now_ms())
        .execute(&self.writer)
        .await?;
        Ok(r.rows_affected())
    }

    async fn redrive(&self, id: Option<MessageId>, destination: Option<&str>) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE outbox SET state = 'pending', attempts = 0, available_at = ?1
             WHERE state = 'dead' AND (?2 IS NULL OR id = ?2) AND (?3 IS NULL OR destination = ?3)",
        )
        .bind(self.clock.now_ms())
        .bind(id)
        .bind(destination)
        .execute(&self.writer)
        .await?;
        Ok(r.rows_affected())
    }

    async fn purge_dead_letter(&self, id: MessageId) -> Result<u64> {
        let r = sqlx::query("DELETE FROM outbox WHERE state = 'dead' AND id = ?1")
            .bind(id)
            .execute(&self.writer)
            .await?;
        Ok(r.rows_affected())
    }

    async fn prune_batch(&self, table: Table, older_than: Duration, limit: i64) -> Result<u64> {
        let sql = match table {
            Table::Delivered => {
                "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox
                   WHERE state = 'delivered' AND delivered_at < ?1 LIMIT ?2)"
            }
            Table::Dead => {
                "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox
                   WHERE state = 'dead' AND created_at < ?1 LIMIT ?2)"
            }
            Table::Inbox => {
                // Never the record of a message this database may still deliver again
                // (its outbox row pending, in flight or dead: re-drivable), however old
                // it is: downtime does not end a redelivery window.
                "DELETE FROM inbox WHERE (consumer, message_id) IN (SELECT consumer, message_id
                   FROM inbox WHERE received_at < ?1 AND NOT EXISTS (SELECT 1 FROM outbox o
                     WHERE o.id = inbox.message_id AND o.state <> 'delivered') LIMIT ?2)"
            }
        };
        let r = sqlx::query(sql)
            .bind(self.clock.now_ms().saturating_sub(millis(older_than)))
            .bind(limit)
            .execute(&self.writer)
            .await?;
        Ok(r.rows_affected())
    }

    async fn stats(&self) -> Result<Stats> {
        let now = self.clock.now_ms();
        let row = sqlx::query(
            "SELECT
               (SELECT count(*) FROM outbox WHERE state = 'pending') AS pending,
               (SELECT count(*) FROM outbox WHERE state = 'in_flight') AS in_flight,
               (SELECT count(*) FROM outbox WHERE state = 'delivered') AS delivered,
               (SELECT count(*) FROM outbox WHERE state = 'dead') AS dead,
               (SELECT count(*) FROM outbox
                 WHERE state = 'pending' AND substr(last_error, 1, 12) = 'unavailable:') AS unavailable,
               (SELECT min(available_at) FROM outbox
                 WHERE state = 'pending' AND available_at <= ?1) AS oldest",
        )
        .bind(now)
        .fetch_one(&self.reader)
        .await?;
        let oldest: Option<i64> = row.try_get("oldest")?;
        Ok(Stats {
            pending: row.try_get::<i64, _>("pending")? as u64,
            in_flight: row.try_get::<i64, _>("in_flight")? as u64,
            delivered: row.try_get::<i64, _>("delivered")? as u64,
            dead: row.try_get::<i64, _>("dead")? as u64,
            unavailable: row.try_get::<i64, _>("unavailable")? as u64,
            oldest_pending_age_ms: oldest.map(|t| now.saturating_sub(t).max(0) as u64),
        })
    }

    async fn dead_letters(&self, q: &DeadQuery<'_>) -> Result<(Vec<DeadRow>, bool)> {
        // The rows' sizes first, then only the rows that fit: a page never holds more
        // than its bytes (and one row) in memory.
        let sizes: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT seq, length(CAST(payload AS BLOB)) + length(CAST(headers AS BLOB))
                    + coalesce(length(CAST(last_error AS BLOB)), 0)
             FROM outbox WHERE state = 'dead' AND (?1 IS NULL OR destination = ?1)
               AND (?2 IS NULL OR seq < ?2)
             ORDER BY seq DESC LIMIT ?3",
        )
        .bind(q.destination)
        .bind(q.before_seq)
        .bind(i64::from(q.limit) + 1)
        .fetch_all(&self.reader)
        .await?;
        let Some(((low, high), more)) = within_bytes(&sizes, q.limit, q.max_bytes) else {
            return Ok((Vec::new(), false));
        };
        let rows = sqlx::query(
            "SELECT seq, id, destination, key, payload, headers, attempts, created_at, last_error
             FROM outbox WHERE state = 'dead' AND (?1 IS NULL OR destination = ?1)
               AND seq >= ?2 AND seq <= ?3
             ORDER BY seq DESC",
        )
        .bind(q.destination)
        .bind(low)
        .bind(high)
        .fetch_all(&self.reader)
        .await?;
        Ok((rows.iter().map(dead_row).collect::<Result<_>>()?, more))
    }

    async fn dead_letter_by_id(&self, id: MessageId) -> Result<Option<DeadRow>> {
        let row = sqlx::query(
            "SELECT seq, id, destination, key, payload, headers, attempts, created_at, last_error
             FROM outbox WHERE id = ?1 AND state = 'dead'",
        )
        .bind(id)
        .fetch_optional(&self.reader)
        .await?;
        row.as_ref().map(dead_row).transpose()
    }

    async fn close(&self) {
        if let Some(c) = &self.checkpoints {
            c.stop();
        }
        self.reader.close().await;
        self.writer.close().await;
    }
}
