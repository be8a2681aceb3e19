//! PostgreSQL's statements: the store's [`Dialect`].

use std::time::Duration;

use sqlx::{PgConnection, Row};

use super::Postgres;
use crate::clock::millis;
use crate::store::admin_types::{DeadQuery, DeadRow, Stats, Table};
use crate::store::backend::{Dialect, dead_row, envelope, within_bytes};
use crate::store::queue_types::{Claim, DeadLetter, Retry};
use crate::{Envelope, Message, MessageId, Result};

// The acknowledgements below match `lease_owner` and not `state = 'in_flight'`: a row
// has a lease owner exactly when it is in flight (a CHECK constraint, migration 0004),
// and without the state in the WHERE clause the planner goes by primary key rather than
// bitmap-scanning `outbox_lease` and its dead entries.

impl Dialect for Postgres {
    type Conn = PgConnection;

    /// Takes a transaction-level advisory lock first, held until the caller's
    /// transaction ends, so that concurrent producers count one after another and each
    /// sees the rows the one before it committed: the limit holds under concurrency.
    async fn count_pending(c: &mut PgConnection, limit: u64) -> Result<u64> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('agentsaga.max_pending'))")
            .execute(&mut *c)
            .await?;
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT 1 FROM outbox WHERE state = 'pending' LIMIT $1) t",
        )
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_one(c)
        .await?;
        Ok(n as u64)
    }

    async fn enqueue_leased(
        c: &mut PgConnection,
        m: &Message,
        owner: &str,
        lease: Duration,
        _: i64,
        _: i64,
    ) -> Result<Option<Envelope>> {
        let row = sqlx::query(
            "INSERT INTO outbox (id, destination, key, payload, headers,
                                 state, attempts, lease_owner, lease_until)
             SELECT $1, $2, $3, $4::jsonb, $5::jsonb, 'in_flight', 1, $6,
                    pg_catalog.clock_timestamp() + $7 * interval '1 millisecond'
             WHERE $3::text IS NULL OR NOT EXISTS (SELECT 1 FROM outbox
                 WHERE key = $3::text AND state IN ('pending', 'in_flight'))
             -- its id stored already, or (unique outbox_key_in_flight) a concurrent
             -- producer's row of its key in flight: written pending by the caller
             ON CONFLICT DO NOTHING
             RETURNING seq, id, destination, key, payload::text AS payload,
                 headers::text AS headers, attempts,
                 (extract(epoch FROM created_at) * 1000)::bigint AS created_at",
        )
        .bind(m.id)
        .bind(&m.destination)
        .bind(m.key.as_deref())
        .bind(&m.payload)
        .bind(m.headers_json()?)
        .bind(owner)
        .bind(millis(lease))
        .fetch_optional(c)
        .await?;
        row.as_ref().map(envelope).transpose()
    }

    async fn enqueue(c: &mut PgConnection, messages: &[Message], _: i64) -> Result<()> {
        if let [m] = messages {
            sqlx::query(
                "INSERT INTO outbox (id, destination, key, payload, headers, available_at)
                 VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, clock_timestamp() + $6 * interval '1 millisecond')
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(m.id)
            .bind(&m.destination)
            .bind(m.key.as_deref())
            .bind(&m.payload)
            .bind(m.headers_json()?)
            .bind(m.delay_ms())
            .execute(c)
            .await?;
            return Ok(());
        }
        let headers = messages
            .iter()
            .map(Message::headers_json)
            .collect::<Result<Vec<_>>>()?;
        MessageRows::of(messages, &headers, 0..messages.len())
            .insert_pending(c)
            .await
    }

    async fn enqueue_dead(c: &mut PgConnection, m: &Message, reason: &str, _: i64) -> Result<bool> {
        let r = sqlx::query(
            "INSERT INTO outbox (id, destination, key, payload, headers, state, last_error)
             VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, 'dead', $6) ON CONFLICT (id) DO NOTHING",
        )
        .bind(m.id)
        .bind(&m.destination)
        .bind(m.key.as_deref())
        .bind(&m.payload)
        .bind(m.headers_json()?)
        .bind(reason)
        .execute(c)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn receive(c: &mut PgConnection, consumer: &str, id: MessageId, _: i64) -> Result<bool> {
        let r = sqlx::query(
            "INSERT INTO inbox (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(id)
        .execute(c)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn cancel_pending(c: &mut PgConnection, ids: &[MessageId]) -> Result<u64> {
        let r = sqlx::query("DELETE FROM outbox WHERE state = 'pending' AND id = ANY($1)")
            .bind(ids)
            .execute(c)
            .await?;
        Ok(r.rows_affected())
    }

    async fn dead_letter(c: &mut PgConnection, owner: &str, dead: &[DeadLetter]) -> Result<u64> {
        let seqs: Vec<i64> = dead.iter().map(|d| d.seq).collect();
        let reasons: Vec<String> = dead.iter().map(|d| d.reason.clone()).collect();
        let r = sqlx::query(
            "UPDATE outbox o
             SET state = 'dead', last_error = u.e, lease_owner = NULL, lease_until = NULL
             FROM unnest($1::bigint[], $2::text[]) AS u(s, e)
             WHERE o.seq = u.s AND o.lease_owner = $3",
        )
        .bind(seqs)
        .bind(reasons)
        .bind(owner)
        .execute(c)
        .await?;
        Ok(r.rows_affected())
    }

    async fn seen(&self, consumer: &str, id: MessageId) -> Result<bool> {
        let row = sqlx::query("SELECT 1 FROM inbox WHERE consumer = $1 AND message_id = $2")
            .bind(consumer)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    async fn claim(&self, claim: &Claim<'_>) -> Result<Vec<Envelope>> {
        // The statement lives in `agentsaga_claim` (migration 0004), which plans it as
        // an ordered walk of `outbox_pending`; see there for why.
        let rows = sqlx::query("SELECT * FROM agentsaga_claim($1, $2, $3, $4)")
            .bind(claim.owner)
            .bind(millis(claim.lease))
            .bind(claim.destinations)
            .bind(i64::from(claim.limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(envelope).collect()
    }

    async fn ack_and_claim(
        &self,
        delivered: &[i64],
        claim: &Claim<'_>,
    ) -> Result<(u64, Vec<Envelope>)> {
        // `agentsaga_ack_and_claim` (migrations 0004, 0006): its first row carries the
        // count of rows marked delivered in `acked`, the claimed rows follow.
        let rows = sqlx::query("SELECT * FROM agentsaga_ack_and_claim($1, $2, $3, $4, $5)")
            .bind(claim.owner)
            .bind(delivered)
            .bind(millis(claim.lease))
            .bind(claim.destinations)
            .bind(i64::from(claim.limit))
            .fetch_all(&self.pool)
            .await?;
        let mut acked = 0;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in &rows {
            match row.try_get::<Option<i64>, _>("acked")? {
                Some(n) => acked = u64::try_from(n).unwrap_or(0),
                None => claimed.push(envelope(row)?),
            }
        }
        Ok((acked, claimed))
    }

    async fn mark_delivered(&self, owner: &str, seqs: &[i64]) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE outbox
             SET state = 'delivered', delivered_at = now(), lease_owner = NULL, lease_until = NULL
             WHERE seq = ANY($1) AND lease_owner = $2",
        )
        .bind(seqs)
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn retry_later(&self, owner: &str, retries: &[Retry]) -> Result<u64> {
        let seqs: Vec<i64> = retries.iter().map(|r| r.seq).collect();
        let delays: Vec<i64> = retries.iter().map(|r| millis(r.delay)).collect();
        let errors: Vec<String> = retries.iter().map(|r| r.error.clone()).collect();
        let spent: Vec<bool> = retries.iter().map(|r| r.spent).collect();
        let r = sqlx::query(
            "UPDATE outbox o
             SET state = 'pending', available_at = now() + u.t * interval '1 millisecond',
                 last_error = u.e, lease_owner = NULL, lease_until = NULL,
                 attempts = CASE WHEN u.p = false THEN greatest(o.attempts - 1, 0) ELSE o.attempts END
             FROM unnest($1::bigint[], $2::bigint[], $3::text[], $5::bool[]) AS u(s, t, e, p)
             WHERE o.seq = u.s AND o.lease_owner = $4",
        )
        .bind(seqs)
        .bind(delays)
        .bind(errors)
        .bind(owner)
        .bind(spent)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn release(&self, owner: &str, seqs: &[i64]) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE outbox
             SET state = 'pending', attempts = greatest(attempts - 1, 0),
                 lease_owner = NULL, lease_until = NULL
             WHERE seq = ANY($1) AND lease_owner = $2",
        )
        .bind(seqs)
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn renew(&self, owner: &str, seqs: &[i64], lease: Duration) -> Result<Vec<i64>> {
        // From the statement's own time, not its transaction's start.
        let renewed = sqlx::query_scalar(
            "UPDATE outbox SET lease_until = pg_catalog.clock_timestamp() + $1 * interval '1 millisecond'
             WHERE seq = ANY($2) AND lease_owner = $3
             RETURNING seq",
        )
        .bind(millis(lease))
        .bind(seqs)
        .bind(owner)
        .fetch_all(&self.pool)
        .await?;
        Ok(renewed)
    }

    async fn reclaim_expired(&self) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE outbox SET state = 'pending', lease_owner = NULL, lease_until = NULL
             WHERE state = 'in_flight' AND lease_until < pg_catalog.clock_timestamp()",
        )
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn redrive(&self, id: Option<MessageId>, destination: Option<&str>) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE outbox SET state = 'pending', attempts = 0, available_at = now()
             WHERE state = 'dead' AND ($1::uuid IS NULL OR id = $1)
               AND ($2::text IS NULL OR destination = $2)",
        )
        .bind(id)
        .bind(destination)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn purge_dead_letter(&self, id: MessageId) -> Result<u64> {
        let r = sqlx::query("DELETE FROM outbox WHERE state = 'dead' AND id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected())
    }

    async fn prune_batch(&self, table: Table, older_than: Duration, limit: i64) -> Result<u64> {
        let sql = match table {
            Table::Delivered => {
                "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE state = 'delivered'
                   AND delivered_at < now() - $1 * interval '1 millisecond' LIMIT $2)"
            }
            Table::Dead => {
                "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE state = 'dead'
                   AND created_at < now() - $1 * interval '1 millisecond' LIMIT $2)"
            }
            Table::Inbox => {
                // As on SQLite: never the record of a message still re-deliverable here.
                "DELETE FROM inbox WHERE (consumer, message_id) IN (SELECT consumer, message_id
                   FROM inbox WHERE received_at < now() - $1 * interval '1 millisecond'
                   AND NOT EXISTS (SELECT 1 FROM outbox o
                     WHERE o.id = inbox.message_id AND o.state <> 'delivered') LIMIT $2)"
            }
        };
        let r = sqlx::query(sql)
            .bind(millis(older_than))
            .bind(limit)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected())
    }

    async fn stats(&self) -> Result<Stats> {
        let row = sqlx::query(
            "SELECT
               count(*) FILTER (WHERE state = 'pending') AS pending,
               count(*) FILTER (WHERE state = 'in_flight') AS in_flight,
               count(*) FILTER (WHERE state = 'delivered') AS delivered,
               count(*) FILTER (WHERE state = 'dead') AS dead,
               count(*) FILTER (WHERE state = 'pending' AND substr(last_error, 1, 12) = 'unavailable:')
                   AS unavailable,
               (extract(epoch FROM now() - min(available_at)
                    FILTER (WHERE state = 'pending' AND available_at <= now())) * 1000)::bigint
                   AS oldest
             FROM outbox",
        )
        .fetch_one(&self.pool)
        .await?;
        let oldest: Option<i64> = row.try_get("oldest")?;
        Ok(Stats {
            pending: row.try_get::<i64, _>("pending")? as u64,
            in_flight: row.try_get::<i64, _>("in_flight")? as u64,
            delivered: row.try_get::<i64, _>("delivered")? as u64,
            dead: row.try_get::<i64, _>("dead")? as u64,
            unavailable: row.try_get::<i64, _>("unavailable")? as u64,
            oldest_pending_age_ms: oldest.map(|t| t.max(0) as u64),
        })
    }

    async fn dead_letters(&self, q: &DeadQuery<'_>) -> Result<(Vec<DeadRow>, bool)> {
        // The rows' sizes first, then only the rows that fit: a page never holds more
        // than its bytes (and one row) in memory.
        const SIZES: &str = "SELECT seq, (octet_length(payload::text)
                + octet_length(headers::text) + coalesce(octet_length(last_error), 0))::bigint
            FROM outbox WHERE state = 'dead' AND ($1::text IS NULL OR destination = $1)
              AND ($2::bigint IS NULL OR seq < $2)
            ORDER BY seq DESC LIMIT $3";
        const SQL: &str = "SELECT seq, id, destination, key, payload::text AS payload,
            headers::text AS headers, attempts,
            (extract(epoch FROM created_at) * 1000)::bigint AS created_at, last_error
            FROM outbox WHERE state = 'dead' AND ($1::text IS NULL OR destination = $1)
              AND seq >= $2 AND seq <= $3
            ORDER BY seq DESC";
        let sizes: Vec<(i64, i64)> = sqlx::query_as(SIZES)
            .bind(q.destination)
            .bind(q.before_seq)
            .bind(i64::from(q.limit) + 1)
            .fetch_all(&self.pool)
            .await?;
        let Some(((low, high), more)) = within_bytes(&sizes, q.limit, q.max_bytes) else {
            return Ok((Vec::new(), false));
        };
        let rows = sqlx::query(SQL)
            .bind(q.destination)
            .bind(low)
            .bind(high)
            .fetch_all(&self.pool)
            .await?;
        Ok((rows.iter().map(dead_row).collect::<Result<_>>()?, more))
    }

    async fn dead_letter_by_id(&self, id: MessageId) -> Result<Option<DeadRow>> {
        const SQL: &str = "SELECT seq, id, destination, key, payload::text AS payload,
            headers::text AS headers, attempts,
            (extract(epoch FROM created_at) * 1000)::bigint AS created_at, last_error
            FROM outbox WHERE id = $1 AND state = 'dead'";
        let row = sqlx::query(SQL).bind(id).fetch_optional(&self.pool).await?;
        row.as_ref().map(dead_row).transpose()
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}

/// Messages as the columns of one `unnest` statement (one array per column).
#[derive(Debug, Default)]
pub(crate) struct MessageRows {
    pub(crate) ids: Vec<MessageId>,
    pub(crate) destinations: Vec<String>,
    pub(crate) keys: Vec<Option<String>>,
    pub(crate) payloads: Vec<String>,
    pub(crate) headers: Vec<String>,
    pub(crate) delays: Vec<i64>,
}

impl MessageRows {
    /// The messages of `messages` at the positions `at`, `headers[i]` the stored
    /// headers of `messages[i]` ([`Message::headers_json`]).
    pub(crate) fn of(
        messages: &[Message],
        headers: &[String],
        at: impl IntoIterator<Item = usize>,
    ) -> Self {
        let mut rows = Self::default();
        for i in at {
            let m = &messages[i];
            rows.ids.push(m.id);
            rows.destinations.push(m.destination.clone());
            rows.keys.push(m.key.clone());
            rows.payloads.push(m.payload.clone());
            rows.headers.push(headers[i].clone());
            rows.delays.push(m.delay_ms());
        }
        rows
    }

    /// Inserts them `pending`, each available after its delay, in order (an id
    /// already stored is skipped).
    pub(crate) async fn insert_pending(self, c: &mut PgConnection) -> Result<()> {
        sqlx::query(
            "INSERT INTO outbox (id, destination, key, payload, headers, available_at)
             SELECT u.id, u.d, u.k, u.p::jsonb, u.h::jsonb, clock_timestamp() + u.t * interval '1 millisecond'
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[])
                  WITH ORDINALITY AS u(id, d, k, p, h, t, ord)
             ORDER BY u.ord
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(self.ids)
        .bind(self.destinations)
        .bind(self.keys)
        .bind(self.payloads)
        .bind(self.headers)
        .bind(self.delays)
        .execute(c)
        .await?;
        Ok(())
    }
}
