//! The SQLite backend's SQL. Times are Unix milliseconds from this process's clock.
//! Lists of rows travel as one JSON array bound to `json_each`, so every batch is one
//! prepared statement whatever its size.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Row, SqliteConnection};

use super::admin::{DeadQuery, DeadRow, Stats, Table};
use super::backend::{Dialect, check_schema, dead_row, envelope, within_bytes};
use super::checkpoint::{self, Checkpointer};
use super::direct::{self, Session, Statement, Statements, Value};
use super::queue::{Claim, DeadLetter, Retry};
use super::{Prefetch, Prefetched, StoreConfig, Synchronous};
use crate::clock::{millis, now_ms};
use crate::{Envelope, Error, Message, MessageId, Result};

/// An open SQLite database: one writer connection that every write transaction queues
/// for (so that writers in this process never meet `SQLITE_BUSY`), and a pool of
/// read-only connections (the writer itself for `sqlite::memory:`).
#[derive(Clone, Debug)]
pub(crate) struct Sqlite {
    pub(crate) writer: SqlitePool,
    pub(crate) reader: SqlitePool,
    /// Checkpoints the WAL off the writer's path (`None` in memory: no WAL).
    pub(crate) checkpoints: Option<Checkpointer>,
}

/// Opens (creating and migrating if need be) the database.
///
/// Processes that open one new file at the same moment race to create it, switch it to
/// WAL and migrate it, and SQLite answers the loser with `SQLITE_BUSY` at once (its busy
/// handler would deadlock there), so opening tries again, within the busy timeout.
pub(super) async fn open(url: &str, config: &StoreConfig) -> Result<Sqlite> {
    super::direct::memory_statistics_off();
    let deadline = tokio::time::Instant::now() + config.busy_timeout;
    let mut delay = std::time::Duration::from_millis(10);
    loop {
        match open_once(url, config).await {
            Err(e) if is_busy(&e) && tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "sqlite database busy while opening; trying again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_millis(200));
            }
            done => return done,
        }
    }
}

/// Is this SQLITE_BUSY or SQLITE_LOCKED (any extended code), however wrapped?
pub(super) fn is_busy(e: &Error) -> bool {
    // `Error::Database` is transparent: its `source()` skips the sqlx error it holds.
    let mut cur: Option<&(dyn std::error::Error + 'static)> = match e {
        Error::Database(db) => Some(db),
        e => Some(e),
    };
    while let Some(err) = cur {
        if let Some(sqlx::Error::Database(db)) = err.downcast_ref::<sqlx::Error>() {
            let code: i64 = db.code().and_then(|c| c.parse().ok()).unwrap_or(0);
            if matches!(code & 0xff, 5 | 6) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

async fn open_once(url: &str, config: &StoreConfig) -> Result<Sqlite> {
    let invalid = |e: sqlx::Error| Error::InvalidUrl {
        url: url.to_owned(),
        reason: e.to_string(),
    };
    let base = SqliteConnectOptions::from_str(url).map_err(invalid)?;
    let memory = url.contains(":memory:") || url.contains("mode=memory");
    let options = base
        .create_if_missing(true)
        .journal_mode(if memory {
            SqliteJournalMode::Memory
        } else {
            SqliteJournalMode::Wal
        })
        .synchronous(match config.synchronous {
            Synchronous::Normal => SqliteSynchronous::Normal,
            Synchronous::Full => SqliteSynchronous::Full,
        })
        .busy_timeout(config.busy_timeout)
        .foreign_keys(true)
        // Temporary files in memory: above all the statement journals that every hop's
        // savepoint keeps in a shared transaction (a copy of each page it first
        // changes), which in files cost a `pwrite` each, two thirds of the writer's
        // system calls in the saga bench.
        .pragma("temp_store", "MEMORY");
    // The WAL's checkpoints run in the background (see `checkpoint`); the writer's own
    // only past a threshold, as a safety net.
    let options = if memory {
        options
    } else {
        options.pragma("wal_autocheckpoint", checkpoint::WRITER_PAGES.to_string())
    };
    let connect = |e| Error::Connect {
        scheme: "sqlite",
        source: e,
    };
    // One writer connection: writers of this process queue for it instead of fighting
    // over SQLite's single write lock (which surfaces as SQLITE_BUSY).
    // No ping before each acquire: the connection is a file handle in this process,
    // not a socket that can hang up, and on SQLite a ping is one more round trip to
    // sqlx's worker thread on every transaction (the pool still pings on release).
    let writer = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .test_before_acquire(false)
        .acquire_timeout(config.acquire_timeout)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options.clone())
        .await
        .map_err(connect)?;
    check_schema(&applied(&writer).await?, &super::SQLITE_MIGRATOR)?;
    migrate(&writer).await?;
    foreign_keys_on(&writer).await?;
    let reader = if memory {
        // Each connection to `:memory:` is a database of its own: share the writer.
        writer.clone()
    } else {
        SqlitePoolOptions::new()
            .max_connections(config.max_connections)
            .test_before_acquire(false)
            .acquire_timeout(config.acquire_timeout)
            .connect_with(options.clone().read_only(true))
            .await
            .map_err(connect)?
    };
    let checkpoints = (!memory).then(|| Checkpointer::start(options));
    Ok(Sqlite {
        writer,
        reader,
        checkpoints,
    })
}

/// Applies the embedded migrations. SQLite has no lock for this (sqlx's is a no-op
/// there), so two processes opening one new file may both try a migration. The loser's
/// fails ("table already exists") and is rolled back; or, for a migration that runs
/// its own transaction (0009, `-- no-transaction`), it waits for the winner's to commit,
/// repeats its work on the migrated tables (the same result) and fails on recording the
/// version the winner recorded. When the applied migrations changed during a failed
/// run, another process is migrating: run again, and skip what it applied.
async fn migrate(writer: &SqlitePool) -> Result<()> {
    for _ in 0..=super::SQLITE_MIGRATOR.iter().count() {
        let before = applied(writer).await?;
        match super::SQLITE_MIGRATOR.run(writer).await {
            Ok(()) => return Ok(()),
            Err(e) if applied(writer).await? == before => return Err(e.into()),
            Err(e) => tracing::debug!(error = %e, "another process is migrating; running again"),
        }
    }
    Ok(super::SQLITE_MIGRATOR.run(writer).await?)
}

/// Turns foreign keys on again on the writer, and checks that they are. Migration 0009
/// turns them off while it rebuilds tables and back on at its end; a run of it that
/// failed midway (another process migrating at the same time, a busy timeout) and was
/// skipped on the retry would otherwise leave the writer without them for the life of
/// the process: no cascade from a pruned saga to its steps, no check of a step's saga.
async fn foreign_keys_on(writer: &SqlitePool) -> Result<()> {
    sqlx::query("PRAGMA foreign_keys = ON")
        .execute(writer)
        .await?;
    let on: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
        .fetch_one(writer)
        .await?;
    if on != 1 {
        return Err(Error::Database(sqlx::Error::Protocol(
            "SQLite refused to turn foreign keys on (a transaction left open?)".to_owned(),
        )));
    }
    Ok(())
}

/// The versions of the migrations applied, in order (none before the first).
async fn applied(pool: &SqlitePool) -> Result<Vec<i64>> {
    let exists: Option<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_optional(pool)
    .await?;
    if exists.is_none() {
        return Ok(Vec::new());
    }
    Ok(
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(pool)
            .await?,
    )
}

fn seq_list(seqs: &[i64]) -> String {
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
    ) -> Result<Option<Envelope>> {
        let now = now_ms();
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
        .bind(now.saturating_add(millis(lease)))
        .fetch_optional(c)
        .await?;
        row.as_ref().map(envelope).transpose()
    }

    async fn enqueue(c: &mut SqliteConnection, messages: &[Message]) -> Result<()> {
        let now = now_ms();
        if let [m] = messages {
            sqlx::query(
                "INSERT INTO outbox (id, destination, key, payload, headers, available_at, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(m.id)
            .bind(&m.destination)
            .bind(m.key.as_deref())
            .bind(&m.payload)
            .bind(m.headers_json()?)
            .bind(now.saturating_add(m.delay_ms()))
            .bind(now)
            .execute(c)
            .await?;
            return Ok(());
        }
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

    async fn receive(c: &mut SqliteConnection, consumer: &str, id: MessageId) -> Result<bool> {
        let r = sqlx::query(
            "INSERT INTO inbox (consumer, message_id, received_at) VALUES (?1, ?2, ?3)
             ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(id)
        .bind(now_ms())
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

    async fn seen(&self, consumer: &str, id: MessageId) -> Result<bool> {
        let row = sqlx::query("SELECT 1 FROM inbox WHERE consumer = ?1 AND message_id = ?2")
            .bind(consumer)
            .bind(id)
            .fetch_optional(&self.reader)
            .await?;
        Ok(row.is_some())
    }

    async fn claim(&self, claim: &Claim<'_>) -> Result<Vec<Envelope>> {
        Sqlite::claim_on(&mut *self.writer.acquire().await?, claim).await
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
        Sqlite::mark_delivered_on(&mut *self.writer.acquire().await?, owner, seqs).await
    }

    async fn retry_later(&self, owner: &str, retries: &[Retry]) -> Result<u64> {
        let list: Vec<_> = retries
            .iter()
            .map(|r| serde_json::json!([r.seq, millis(r.delay), r.error]))
            .collect();
        let r = sqlx::query(
            "UPDATE outbox
             SET state = 'pending', available_at = ?1 + u.delay, last_error = u.error,
                 lease_owner = NULL, lease_until = NULL
             FROM (SELECT json_extract(value, '$[0]') AS seq, json_extract(value, '$[1]') AS delay,
                          json_extract(value, '$[2]') AS error
                   FROM json_each(?2)) AS u
             WHERE outbox.seq = u.seq AND outbox.state = 'in_flight' AND outbox.lease_owner = ?3",
        )
        .bind(now_ms())
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
        .bind(now_ms().saturating_add(millis(lease)))
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
        .bind(now_ms())
        .execute(&self.writer)
        .await?;
        Ok(r.rows_affected())
    }

    async fn redrive(&self, id: Option<MessageId>, destination: Option<&str>) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE outbox SET state = 'pending', attempts = 0, available_at = ?1
             WHERE state = 'dead' AND (?2 IS NULL OR id = ?2) AND (?3 IS NULL OR destination = ?3)",
        )
        .bind(now_ms())
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
            .bind(now_ms().saturating_sub(millis(older_than)))
            .bind(limit)
            .execute(&self.writer)
            .await?;
        Ok(r.rows_affected())
    }

    async fn stats(&self) -> Result<Stats> {
        let now = now_ms();
        let row = sqlx::query(
            "SELECT
               (SELECT count(*) FROM outbox WHERE state = 'pending') AS pending,
               (SELECT count(*) FROM outbox WHERE state = 'in_flight') AS in_flight,
               (SELECT count(*) FROM outbox WHERE state = 'delivered') AS delivered,
               (SELECT count(*) FROM outbox WHERE state = 'dead') AS dead,
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

/// How long a hop's opening round trip is waited for without sleeping ([`Answer`]).
const ANSWER_SPIN: Duration = Duration::from_micros(300);

/// A hop's inbox record, around its values (consumer, message id, time): returns a
/// row if the message was recorded now, none if it was there already.
const INBOX_RECORD_HEAD: &str = "INSERT INTO inbox (consumer, message_id, received_at) VALUES (";
const INBOX_RECORD_TAIL: &str = ") ON CONFLICT DO NOTHING RETURNING 1";

/// Waits for the items of a hop's opening round trip to the writer's thread without a
/// wake-up per item, where it can.
///
/// sqlx sends a round trip's results one item at a time (a row, a statement's count),
/// each through a channel to the waiting task; a task that sleeps between items is woken
/// for each (a hop's round trip has ten or more), and on this project's 2-vCPU VMs a
/// wake-up that crosses vCPUs costs more than the statement it waits for. So for up to
/// [`ANSWER_SPIN`] from the round trip's start, the items are polled without a waker,
/// the thread yielding between polls (to the connection's thread, if they share a
/// vCPU); after that, the wait sleeps as any other. Measured on the saga bench
/// (2026-11-25): +10–20 % sagas/s on SQLite. The budget bounds how long a round trip
/// keeps its tokio worker from other tasks. (Waiting alike for `BEGIN`, `COMMIT` and
/// the relay's claims and acknowledgements, which also run in the lane, made no
/// measurable difference: they are a few round trips per batch of hops.)
struct Answer {
    until: std::time::Instant,
}

impl Answer {
    fn new() -> Self {
        Self {
            until: std::time::Instant::now() + ANSWER_SPIN,
        }
    }

    async fn wait<F: std::future::Future>(&mut self, fut: F) -> F::Output {
        use std::task::{Context, Poll, Waker};
        let mut fut = std::pin::pin!(fut);
        loop {
            // The context lives in this block alone: it is not `Send`, and the wait below
            // is an await point.
            let polled = fut.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            if let Poll::Ready(v) = polled {
                return v;
            }
            if std::time::Instant::now() >= self.until {
                return fut.await;
            }
            std::thread::yield_now();
        }
    }
}

impl Sqlite {
    /// Runs `prefix` (`statements` savepoint statements, each ending in `;`) and then,
    /// if `inbox` is given, records that message in the inbox, all in one round trip
    /// (one hand-off to the connection's thread). `Ok(Some(true))`: recorded now;
    /// `Ok(Some(false))`: it was there already. On an error, also how many statements
    /// of the prefix completed before it, so the caller knows which hop it belongs to.
    ///
    /// Several statements in one query is a SQLite-only feature of sqlx (deprecated
    /// upstream, sqlx#3108, but supported by the 0.9 the lockfile pins); the hop tests
    /// fail if it goes.
    pub(super) async fn open_hop(
        c: &mut SqliteConnection,
        tail: Option<&mut Tail>,
        prefix: &'static str,
        statements: usize,
        inbox: Option<(&str, MessageId)>,
        prefetch: Option<&Prefetch>,
    ) -> std::result::Result<Opened, OpenFailed> {
        use sqlx::Executor;
        // One query, its parameters all `?` (a numbered one would count from the first
        // statement's): the tail's statements, the prefix, the inbox record, the read.
        let (mut q, tail_statements) = match tail {
            Some(t) => {
                let mut q = t.query.to_sqlx();
                q.push(";\n");
                (q, t.query.len())
            }
            None => (sqlx::QueryBuilder::new(""), 0),
        };
        q.push(prefix);
        if let Some((consumer, id)) = inbox {
            q.push(INBOX_RECORD_HEAD);
            q.separated(", ")
                .push_bind(consumer.to_owned())
                .push_bind(id)
                .push_bind(now_ms());
            q.push(INBOX_RECORD_TAIL);
            q.push(";\n");
        }
        if let Some(read) = prefetch {
            // The read's `?`s, bound in order.
            let mut parts = read.sql.split('?');
            q.push(parts.next().unwrap_or_default());
            let mut binds = read.binds.iter();
            for part in parts {
                q.push_bind(binds.next().cloned());
                q.push(part);
            }
        }
        let mut opened = Opened::default();
        if tail_statements == 0 && prefix.is_empty() && inbox.is_none() && prefetch.is_none() {
            return Ok(opened);
        }
        // Count the statements that completed. The rows of the tail's statements are
        // its leased messages'; the inbox record returns a row if it was written now;
        // the rows after it are the read's.
        let reads_from = tail_statements + statements + usize::from(inbox.is_some());
        let mut done = 0;
        let mut recorded = false;
        let mut rows = Vec::new();
        let mut results = c.fetch_many(q.build());
        let mut answer = Answer::new();
        let failed = |done: usize, error: Error, tail_rows| OpenFailed {
            // A failure in the tail counts as one before the prefix's first statement
            // completed.
            prefix_done: done.saturating_sub(tail_statements).min(statements),
            error,
            tail_rows,
        };
        while let Some(step) = answer
            .wait(std::future::poll_fn(|cx| results.as_mut().poll_next(cx)))
            .await
        {
            match step {
                Ok(sqlx::Either::Left(_)) => done += 1,
                Ok(sqlx::Either::Right(row)) => {
                    let row = match direct::Row::from_sqlx(&row) {
                        Ok(row) => row,
                        Err(e) => return Err(failed(done, e, opened.tail_rows)),
                    };
                    if done < tail_statements {
                        opened.tail_rows.push((done, row));
                    } else if done >= reads_from {
                        rows.push(row);
                    } else {
                        recorded = true;
                    }
                }
                Err(e) => return Err(failed(done, e.into(), opened.tail_rows)),
            }
        }
        opened.recorded = inbox.map(|_| recorded);
        opened.read = prefetch.map(|_| Prefetched::of_rows(rows));
        Ok(opened)
    }

    /// As [`open_hop`](Self::open_hop), the statements run by `session` on the
    /// connection directly (SQLite's lane; see [`direct`](super::direct)).
    pub(super) fn open_hop_direct(
        session: &mut Session,
        tail: Option<&mut Tail>,
        prefix: &'static str,
        statements: usize,
        inbox: Option<(&str, MessageId)>,
        prefetch: Option<&Prefetch>,
    ) -> std::result::Result<Opened, OpenFailed> {
        let mut opened = Opened::default();
        if let Some(t) = tail {
            for (k, st) in t.query.statements().iter().enumerate() {
                let rows = &mut opened.tail_rows;
                if let Err(error) = session.run(st, |row| rows.push((k, row))) {
                    return Err(OpenFailed {
                        prefix_done: 0,
                        error,
                        tail_rows: Vec::new(),
                    });
                }
            }
        }
        let failed = |prefix_done, error, opened: Opened| OpenFailed {
            prefix_done,
            error,
            tail_rows: opened.tail_rows,
        };
        let mut done = 0;
        for sql in prefix.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            if let Err(e) = session.run(&Statement::plain(sql), |_| {}) {
                return Err(failed(done, e, opened));
            }
            done += 1;
        }
        debug_assert_eq!(done, statements, "the prefix's statement count");
        if let Some((consumer, id)) = inbox {
            let mut record = Statements::new(INBOX_RECORD_HEAD);
            record
                .separated(", ")
                .push_bind(consumer)
                .push_bind(id)
                .push_bind(now_ms());
            record.push(INBOX_RECORD_TAIL);
            let mut recorded = false;
            for st in record.statements() {
                if let Err(e) = session.run(st, |_| recorded = true) {
                    return Err(failed(statements, e, opened));
                }
            }
            opened.recorded = Some(recorded);
        }
        if let Some(read) = prefetch {
            let st = Statement::with(&read.sql, read.binds.iter().cloned().map(Value::Text));
            let mut rows = Vec::new();
            if let Err(e) = session.run(&st, |row| rows.push(row)) {
                return Err(failed(statements, e, opened));
            }
            opened.read = Some(Prefetched::of_rows(rows));
        }
        Ok(opened)
    }

    /// The claim, on a connection of the caller's (the relay runs it in a hop).
    pub(super) async fn claim_on(
        c: &mut SqliteConnection,
        claim: &Claim<'_>,
    ) -> Result<Vec<Envelope>> {
        let mut query = sqlx::query(CLAIM);
        for value in claim_values(claim)? {
            query = query.bind(value);
        }
        let rows = query.fetch_all(c).await?;
        rows.iter().map(envelope).collect()
    }

    /// Marks rows delivered, on a connection of the caller's.
    pub(super) async fn mark_delivered_on(
        c: &mut SqliteConnection,
        owner: &str,
        seqs: &[i64],
    ) -> Result<u64> {
        let mut query = sqlx::query(MARK_DELIVERED);
        for value in mark_values(owner, seqs) {
            query = query.bind(value);
        }
        let r = query.execute(c).await?;
        Ok(r.rows_affected())
    }
}

/// The relay's claim: its values are [`claim_values`].
const CLAIM: &str = "UPDATE outbox
             SET state = 'in_flight', lease_owner = ?1, lease_until = ?2, attempts = attempts + 1
             WHERE seq IN (
                 SELECT o.seq FROM outbox o
                 WHERE o.state = 'pending' AND o.available_at <= ?3
                   AND o.destination IN (SELECT value FROM json_each(?4))
                   AND (o.key IS NULL OR (
                       NOT EXISTS (SELECT 1 FROM outbox p
                           WHERE p.key = o.key AND p.seq < o.seq
                             AND p.key IS NOT NULL AND p.state IN ('pending', 'in_flight'))
                       AND NOT EXISTS (SELECT 1 FROM outbox f
                           WHERE f.key = o.key AND f.key IS NOT NULL AND f.state = 'in_flight')))
                 ORDER BY o.seq
                 LIMIT ?5)
             RETURNING seq, id, destination, key, payload, headers, attempts, created_at";

/// The claim's values, in the order of its parameters.
fn claim_values(claim: &Claim<'_>) -> Result<Vec<Value>> {
    let now = now_ms();
    Ok(vec![
        Value::Text(claim.owner.to_owned()),
        Value::Int(now.saturating_add(millis(claim.lease))),
        Value::Int(now),
        Value::Text(serde_json::to_string(claim.destinations)?),
        Value::Int(i64::from(claim.limit)),
    ])
}

/// The relay's acknowledgement: its values are [`mark_values`].
const MARK_DELIVERED: &str = "UPDATE outbox
             SET state = 'delivered', delivered_at = ?1, lease_owner = NULL, lease_until = NULL
             WHERE seq IN (SELECT value FROM json_each(?2))
               AND state = 'in_flight' AND lease_owner = ?3";

/// The acknowledgement's values, in the order of its parameters.
fn mark_values(owner: &str, seqs: &[i64]) -> Vec<Value> {
    vec![
        Value::Int(now_ms()),
        Value::Text(seq_list(seqs)),
        Value::Text(owner.to_owned()),
    ]
}

impl Sqlite {
    /// Marks `delivered` rows delivered for `claim.owner` (if any), then claims (if
    /// `claim.limit` > 0), with `session` on the lane's connection directly: the
    /// relay's writes as a hop of the lane.
    pub(super) fn ack_and_claim_direct(
        session: &mut Session,
        delivered: &[i64],
        claim: &Claim<'_>,
    ) -> Result<(u64, Vec<Envelope>)> {
        let mut marked = 0;
        if !delivered.is_empty() {
            let st = Statement::numbered(MARK_DELIVERED, mark_values(claim.owner, delivered));
            session.run(&st, |_| {})?;
            marked = session.changes();
        }
        let mut rows = Vec::new();
        if !claim.destinations.is_empty() && claim.limit > 0 {
            let st = Statement::numbered(CLAIM, claim_values(claim)?);
            session.run(&st, |row| rows.push(row))?;
        }
        let claimed = rows.iter().map(direct_envelope).collect::<Result<_>>()?;
        Ok((marked, claimed))
    }
}

/// Why a hop's opening round trip failed (SQLite).
#[derive(Debug)]
pub(crate) struct OpenFailed {
    /// The prefix's statements that completed (none if the tail failed).
    pub(crate) prefix_done: usize,
    pub(crate) error: Error,
    /// The rows of the tail's statements, if they all ran.
    pub(crate) tail_rows: Vec<(usize, direct::Row)>,
}

/// What a hop's opening round trip found (SQLite).
#[derive(Debug, Default)]
pub(crate) struct Opened {
    /// The inbox record's: written now (`Some(true)`), a duplicate, or none asked.
    pub(crate) recorded: Option<bool>,
    /// The prefetch's rows, if one was asked.
    pub(crate) read: Option<Prefetched>,
    /// The rows of the tail's statements, with each statement's index.
    pub(crate) tail_rows: Vec<(usize, direct::Row)>,
}

/// A write of the caller's statements and then messages in one round trip (see
/// `Tx::enqueue_batch_after`), run at once or deferred to the round trip that ends the
/// hop: the caller's statements, then each message's (a message to hand over is first
/// written leased, then, in case it could not be, pending: it keeps its place in the
/// order either way).
pub(crate) struct Tail {
    query: Statements,
    /// For each of the last `ours.len()` statements: the message it writes leased.
    ours: Vec<Option<usize>>,
    /// Each message's destination, and whether a handover slot was reserved for it.
    messages: Vec<(String, bool)>,
    to: Option<std::sync::Arc<dyn super::Handover>>,
    /// Its slots were settled (kept for the rows written leased, given back for the
    /// others); otherwise dropping it gives them all back.
    settled: bool,
}

/// What a tail wrote: its rows written leased, for `to` to take on commit, and whether
/// any message was written pending.
pub(crate) struct Settled {
    pub(crate) handed: Vec<Envelope>,
    pub(crate) to: Option<std::sync::Arc<dyn super::Handover>>,
    pub(crate) pending: bool,
}

impl std::fmt::Debug for Tail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tail")
            .field("statements", &self.query.len())
            .finish_non_exhaustive()
    }
}

impl Tail {
    /// `query` (statements of the caller's), then `messages`, each
    /// with `leased[i]` (a slot reserved with `to`) written leased if it can be.
    /// Validated already. The tail holds the reserved slots from here on: should it
    /// fail to build, dropping it gives them back.
    pub(crate) fn new(
        mut query: Statements,
        messages: &[Message],
        leased: &[bool],
        to: Option<std::sync::Arc<dyn super::Handover>>,
    ) -> Result<Self> {
        let now = now_ms();
        let (owner, until) = match &to {
            Some(to) => (
                to.owner().to_owned(),
                now.saturating_add(millis(to.lease())),
            ),
            None => (String::new(), now),
        };
        let mut tail = Self {
            query: Statements::default(),
            ours: Vec::new(),
            messages: messages
                .iter()
                .zip(leased)
                .map(|(m, &l)| (m.destination.clone(), l))
                .collect(),
            to,
            settled: false,
        };
        let mut ours = Vec::new();
        let next_statement = |query: &mut Statements| {
            query.end_statement();
        };
        for (i, m) in messages.iter().enumerate() {
            let headers = m.headers_json()?;
            if leased[i] {
                next_statement(&mut query);
                query.push(
                    "INSERT INTO outbox (id, destination, key, payload, headers, available_at,
                         created_at, state, attempts, lease_owner, lease_until)
                     SELECT ",
                );
                push_row(&mut query, m, &headers, now, now);
                query.push(", 'in_flight', 1, ");
                query.push_bind(owner.clone());
                query.push(", ");
                query.push_bind(until);
                query.push(" WHERE ");
                query.push_bind(m.key.clone());
                query.push(" IS NULL OR NOT EXISTS (SELECT 1 FROM outbox WHERE key = ");
                query.push_bind(m.key.clone());
                query.push(
                    " AND state IN ('pending', 'in_flight'))
                     ON CONFLICT (id) DO NOTHING
                     RETURNING seq, id, destination, key, payload, headers, attempts, created_at",
                );
                ours.push(Some(i));
            }
            next_statement(&mut query);
            query.push(
                "INSERT INTO outbox (id, destination, key, payload, headers, available_at, created_at)
                 VALUES (",
            );
            push_row(
                &mut query,
                m,
                &headers,
                now.saturating_add(m.delay_ms()),
                now,
            );
            query.push(") ON CONFLICT (id) DO NOTHING");
            ours.push(None);
        }
        tail.query = query;
        tail.ours = ours;
        Ok(tail)
    }

    /// After its statements ran (`rows`, each with its statement's index): the rows
    /// written leased (to hand over to the handover returned, on commit), and whether
    /// any message was written pending (the relay's to claim). The slots of the messages
    /// not written leased are given back.
    pub(crate) fn settle(mut self, rows: Vec<(usize, direct::Row)>) -> Result<Settled> {
        let first_ours = self.query.len() - self.ours.len();
        let mut written = vec![None; self.messages.len()];
        for (statement, row) in rows {
            if let Some(Some(i)) = statement
                .checked_sub(first_ours)
                .and_then(|k| self.ours.get(k))
            {
                written[*i] = Some(direct_envelope(&row)?);
            }
        }
        self.settled = true;
        let mut handed = Vec::new();
        let mut pending = false;
        for ((destination, leased), row) in self.messages.iter().zip(written) {
            match row {
                Some(row) => handed.push(row),
                None => {
                    if *leased && let Some(to) = &self.to {
                        to.cancel(destination);
                    }
                    pending = true;
                }
            }
        }
        Ok(Settled {
            handed,
            to: self.to.clone(),
            pending,
        })
    }
}

/// Decodes an outbox row the lane read directly (see [`envelope`] for sqlx's rows).
fn direct_envelope(row: &direct::Row) -> Result<Envelope> {
    let corrupt = |column: &str, e: &dyn std::fmt::Display| Error::Corrupt {
        table: "outbox",
        reason: format!("{column}: {e}"),
    };
    Ok(Envelope {
        seq: row.int("seq")?,
        id: row
            .opt_id("id")
            .and_then(|id| id.ok_or_else(|| corrupt("id", &"NULL")))?,
        destination: row.text("destination")?,
        key: row.opt_text("key")?,
        payload: row.text("payload")?,
        headers: serde_json::from_str(&row.text("headers")?).map_err(|e| corrupt("headers", &e))?,
        attempts: u32::try_from(row.int("attempts")?.max(0)).unwrap_or(u32::MAX),
        created_at_ms: row.int("created_at")?,
    })
}

/// Binds a message's row: id, destination, key, payload, headers, available_at,
/// created_at, separated by commas.
fn push_row(
    query: &mut Statements,
    m: &Message,
    headers: &str,
    available_at: i64,
    created_at: i64,
) {
    query
        .separated(", ")
        .push_bind(m.id)
        .push_bind(m.destination.clone())
        .push_bind(m.key.clone())
        .push_bind(m.payload.clone())
        .push_bind(headers.to_owned())
        .push_bind(available_at)
        .push_bind(created_at);
}

impl Drop for Tail {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Some(to) = &self.to {
            for (destination, leased) in &self.messages {
                if *leased {
                    to.cancel(destination);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Answer;

    // A wait that outlasts the budget must sleep on a real waker: were the future left
    // with the no-op waker of the polls before, nothing would wake it and this would
    // time out.
    #[tokio::test]
    async fn an_answer_later_than_the_budget_is_still_awaited() {
        let mut answer = Answer::new();
        let late = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            7
        };
        let got = tokio::time::timeout(Duration::from_secs(10), answer.wait(late)).await;
        assert_eq!(got.ok(), Some(7));
        // The budget is spent: a later item of the same round trip is awaited at once.
        let again = tokio::time::timeout(
            Duration::from_secs(10),
            answer.wait(tokio::time::sleep(Duration::from_millis(1))),
        )
        .await;
        assert!(again.is_ok());
    }

    #[tokio::test]
    async fn a_ready_answer_is_returned_without_waiting() {
        let mut answer = Answer::new();
        assert_eq!(answer.wait(std::future::ready("now")).await, "now");
    }
}
