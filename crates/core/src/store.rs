//! The store: one handle over the outbox and inbox tables of a SQLite or PostgreSQL
//! database, with the embedded migrations applied on open.

mod config;
mod conn;
mod postgres;
mod sqlite;
mod wake;

use std::time::Duration;

use sqlx::{PgPool, SqlitePool};
use tracing::Instrument;

pub use config::{StoreConfig, Synchronous};
pub use conn::{Conn, Tx};
pub use wake::Wakeups;

use crate::{Envelope, Error, Message, MessageId, Result};

/// Migrations for SQLite, embedded in the binary.
pub static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");
/// Migrations for PostgreSQL, embedded in the binary.
pub static POSTGRES_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// A handle to the database holding the outbox and the inbox. Cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), agentsaga_core::Error> {
/// use agentsaga_core::{Message, Store};
///
/// let store = Store::connect("sqlite::memory:").await?;
/// let mut tx = store.begin().await?;
/// // ... the business change, through tx.conn() ...
/// tx.enqueue(&Message::to("billing").json(&serde_json::json!({"charge": 42}))?).await?;
/// tx.commit().await?; // the message exists now, and not a moment before
/// assert_eq!(store.stats().await?.pending, 1);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Store {
    db: Db,
    config: std::sync::Arc<StoreConfig>,
    wake: Wakeups,
}

/// The pools behind a [`Store`], for code that runs its own SQL (the saga engine, the
/// CLI).
#[derive(Clone, Debug)]
pub enum Db {
    /// SQLite: one writer connection that every write transaction queues for (so that
    /// writers in this process never meet `SQLITE_BUSY`), and a pool of readers.
    Sqlite {
        /// The single-connection write pool.
        writer: SqlitePool,
        /// Read-only connections (the writer itself for `sqlite::memory:`).
        reader: SqlitePool,
    },
    /// PostgreSQL: one pool.
    Postgres(PgPool),
}

/// What [`Store::receive`] found in the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipt {
    /// First time this consumer sees this message: process it.
    First,
    /// Seen before: skip it, and do not answer it again.
    Duplicate,
}

/// A batch claim: up to `limit` ready rows for `destinations`, leased to `owner`.
#[derive(Debug, Clone)]
pub struct Claim<'a> {
    /// Who holds the lease (a relay instance id).
    pub owner: &'a str,
    /// Only rows for these destinations.
    pub destinations: &'a [String],
    /// At most this many rows.
    pub limit: u32,
    /// The lease length; an expired lease returns the row to the pool.
    pub lease: Duration,
}

/// A failed delivery to try again later.
#[derive(Debug, Clone)]
pub struct Retry {
    /// The row.
    pub seq: i64,
    /// Not before this delay.
    pub delay: Duration,
    /// The error, kept as `last_error`.
    pub error: String,
}

/// A message given up on.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The row.
    pub seq: i64,
    /// Why, kept as `last_error`.
    pub reason: String,
    /// A notice to enqueue in the same transaction (the `DeliveryFailed` to `reply_to`).
    pub notice: Option<Message>,
}

/// Outbox counts and lag.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Rows waiting for delivery (timers included).
    pub pending: u64,
    /// Rows claimed by a relay.
    pub in_flight: u64,
    /// Rows delivered and not yet pruned.
    pub delivered: u64,
    /// Dead letters.
    pub dead: u64,
    /// How long the oldest ready pending row has been waiting past its `available_at`
    /// (the relay's lag), in milliseconds.
    pub oldest_pending_age_ms: Option<u64>,
}

/// A dead letter as the operator sees it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeadRow {
    /// The message.
    pub envelope: Envelope,
    /// Why it died.
    pub last_error: Option<String>,
}

impl Store {
    /// Opens the database at `url` with the default [`StoreConfig`], creating a SQLite
    /// file if missing and applying the embedded migrations.
    ///
    /// URLs: `sqlite://path/to/file.db`, `sqlite:relative.db`, `sqlite::memory:`,
    /// `postgres://user@host:port/db` (or `postgresql://`).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for an unknown scheme or malformed URL,
    /// [`Error::Connect`] if the database cannot be opened,
    /// [`Error::SchemaTooNew`] if a newer agentsaga migrated it.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, StoreConfig::default()).await
    }

    /// Like [`connect`](Self::connect), with a configuration.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn connect_with(url: &str, config: StoreConfig) -> Result<Self> {
        let scheme = url.split(':').next().unwrap_or_default();
        let (db, wake) = match scheme {
            "sqlite" => (sqlite::open(url, &config).await?, Wakeups::local()),
            "postgres" | "postgresql" => {
                let pool = postgres::open(url, &config).await?;
                let wake = Wakeups::postgres(pool.clone());
                (Db::Postgres(pool), wake)
            }
            "" => {
                return Err(Error::InvalidUrl {
                    url: url.to_owned(),
                    reason: "no scheme: expected sqlite:… or postgres://…".into(),
                });
            }
            other => {
                return Err(Error::InvalidUrl {
                    url: url.to_owned(),
                    reason: format!(
                        "unsupported scheme `{other}`: expected `sqlite` or `postgres`"
                    ),
                });
            }
        };
        Ok(Self {
            db,
            config: std::sync::Arc::new(config),
            wake,
        })
    }

    /// The pools, for code that runs its own SQL.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        match self.db {
            Db::Sqlite { .. } => "sqlite",
            Db::Postgres(_) => "postgres",
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Wakeups: relays subscribe here to learn of new messages at once.
    pub fn wakeups(&self) -> &Wakeups {
        &self.wake
    }

    /// Begins a write transaction. Commit it with [`Tx::commit`], which also wakes the
    /// relays of this process (and, on Postgres, of others) if it enqueued anything.
    ///
    /// # Errors
    /// [`Error::Database`] if no connection can be had.
    pub async fn begin(&self) -> Result<Tx> {
        Tx::begin(self).await
    }

    /// Writes `message` to the outbox through `conn`, which is (part of) the caller's
    /// transaction: it exists once that transaction commits, and never if it rolls
    /// back. Enqueueing an id that is already stored is a no-op.
    ///
    /// After committing a transaction of your own, call [`Store::wake`] so the relay
    /// does not wait for its next poll.
    ///
    /// # Errors
    /// [`Error::EmptyDestination`], [`Error::PayloadTooLarge`], [`Error::Json`] for bad
    /// input; [`Error::QueueFull`] past the configured pending limit (nothing written);
    /// [`Error::BackendMismatch`] for a connection of the other backend.
    pub async fn enqueue<'c>(
        &self,
        conn: impl Into<Conn<'c>>,
        message: &Message,
    ) -> Result<MessageId> {
        self.enqueue_batch(conn, std::slice::from_ref(message))
            .await?;
        Ok(message.id)
    }

    /// Writes several messages in one statement, in order (their seq follows the
    /// slice). All or nothing: one bad message rejects the batch.
    ///
    /// # Errors
    /// As [`enqueue`](Self::enqueue).
    pub async fn enqueue_batch<'c>(
        &self,
        conn: impl Into<Conn<'c>>,
        messages: &[Message],
    ) -> Result<()> {
        for m in messages {
            crate::message::validate(m, self.config.max_message_bytes)?;
        }
        if messages.is_empty() {
            return Ok(());
        }
        let span = tracing::info_span!(
            "outbox.enqueue",
            otel.kind = "producer",
            message.destination = %messages[0].destination,
            message.id = %messages[0].id,
            messages = messages.len(),
            saga.id = tracing::field::Empty,
        );
        if let Some(saga) = messages[0].headers.get(crate::header::SAGA_ID) {
            span.record("saga.id", saga.as_str());
        }
        self.enqueue_checked(conn.into(), messages)
            .instrument(span)
            .await
    }

    async fn enqueue_checked(&self, conn: Conn<'_>, messages: &[Message]) -> Result<()> {
        let mut conn = self.check_backend(conn)?;
        if let Some(limit) = self.config.max_pending {
            let pending = match &mut conn {
                Conn::Sqlite(c) => sqlite::count_pending(c, limit).await?,
                Conn::Postgres(c) => postgres::count_pending(c, limit).await?,
            };
            if pending + messages.len() as u64 > limit {
                return Err(Error::QueueFull { pending, limit });
            }
        }
        match conn {
            Conn::Sqlite(c) => sqlite::enqueue(c, messages).await,
            Conn::Postgres(c) => postgres::enqueue(c, messages).await,
        }
    }

    /// Records that `consumer` received `message_id`, through the caller's transaction.
    /// [`Receipt::Duplicate`] means it was received before: skip it.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn receive<'c>(
        &self,
        conn: impl Into<Conn<'c>>,
        consumer: &str,
        message_id: MessageId,
    ) -> Result<Receipt> {
        let inserted = match self.check_backend(conn.into())? {
            Conn::Sqlite(c) => sqlite::receive(c, consumer, message_id).await?,
            Conn::Postgres(c) => postgres::receive(c, consumer, message_id).await?,
        };
        Ok(if inserted {
            Receipt::First
        } else {
            Receipt::Duplicate
        })
    }

    /// Has `consumer` already received `message_id` (committed)? A read outside any
    /// transaction: a consumer about to do slow work for a message asks first, and
    /// skips a duplicate without redoing it. [`receive`](Self::receive), in the
    /// transaction of the effects, stays the check that counts.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn seen(&self, consumer: &str, message_id: MessageId) -> Result<bool> {
        match &self.db {
            Db::Sqlite { reader, .. } => sqlite::seen(reader, consumer, message_id).await,
            Db::Postgres(pool) => postgres::seen(pool, consumer, message_id).await,
        }
    }

    /// Deletes messages that are still pending, through the caller's transaction: a
    /// timer made moot by the change being committed, a retry no longer wanted. Rows
    /// already claimed or delivered are left alone. Returns how many were deleted.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn cancel_pending<'c>(
        &self,
        conn: impl Into<Conn<'c>>,
        ids: &[MessageId],
    ) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        match self.check_backend(conn.into())? {
            Conn::Sqlite(c) => sqlite::cancel_pending(c, ids).await,
            Conn::Postgres(c) => postgres::cancel_pending(c, ids).await,
        }
    }

    /// Wakes the relays: call after committing a transaction of your own that enqueued.
    pub fn wake(&self) {
        self.wake.wake();
    }

    fn check_backend<'c>(&self, conn: Conn<'c>) -> Result<Conn<'c>> {
        match (&self.db, &conn) {
            (Db::Sqlite { .. }, Conn::Sqlite(_)) | (Db::Postgres(_), Conn::Postgres(_)) => Ok(conn),
            _ => Err(Error::BackendMismatch {
                store: self.backend(),
                connection: conn.backend(),
            }),
        }
    }

    // ----- relay side: one statement per batch -------------------------------------

    /// Claims up to `claim.limit` ready rows, oldest first, honouring per-key order: a
    /// keyed row is claimable only when no earlier row of its key is pending and no row
    /// of its key is in flight. On Postgres, rows locked by another claimer are skipped
    /// (`FOR UPDATE SKIP LOCKED`).
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn claim(&self, claim: &Claim<'_>) -> Result<Vec<Envelope>> {
        if claim.destinations.is_empty() || claim.limit == 0 {
            return Ok(Vec::new());
        }
        let mut rows = match &self.db {
            Db::Sqlite { writer, .. } => sqlite::claim(writer, claim).await?,
            Db::Postgres(pool) => postgres::claim(pool, claim).await?,
        };
        rows.sort_by_key(|e| e.seq);
        Ok(rows)
    }

    /// Marks `delivered` rows delivered (as [`Store::mark_delivered`] does, for
    /// `claim.owner`), then claims (as [`Store::claim`] does, seeing those rows
    /// delivered): the relay's steady state, in one round trip on PostgreSQL and two
    /// statements back to back on SQLite. Returns how many rows were marked delivered and the
    /// claimed rows.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error; then neither happened.
    pub async fn ack_and_claim(
        &self,
        delivered: &[i64],
        claim: &Claim<'_>,
    ) -> Result<(u64, Vec<Envelope>)> {
        if delivered.is_empty() {
            return Ok((0, self.claim(claim).await?));
        }
        if claim.destinations.is_empty() || claim.limit == 0 {
            return Ok((
                self.mark_delivered(claim.owner, delivered).await?,
                Vec::new(),
            ));
        }
        let (n, mut rows) = match &self.db {
            Db::Sqlite { writer, .. } => {
                // Two statements on the single writer, each its own transaction: an
                // explicit transaction around them costs two more trips to the
                // connection's worker thread than the commit it saves (measured).
                let n = sqlite::mark_delivered(writer, claim.owner, delivered).await?;
                (n, sqlite::claim(writer, claim).await?)
            }
            Db::Postgres(pool) => postgres::ack_and_claim(pool, delivered, claim).await?,
        };
        rows.sort_by_key(|e| e.seq);
        Ok((n, rows))
    }

    /// Marks rows delivered. Only rows still leased to `owner` change (a row whose
    /// lease expired and was taken by another relay is that relay's now). Returns how
    /// many changed.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn mark_delivered(&self, owner: &str, seqs: &[i64]) -> Result<u64> {
        if seqs.is_empty() {
            return Ok(0);
        }
        match &self.db {
            Db::Sqlite { writer, .. } => sqlite::mark_delivered(writer, owner, seqs).await,
            Db::Postgres(pool) => postgres::mark_delivered(pool, owner, seqs).await,
        }
    }

    /// Returns rows to `pending` after a failed attempt, each with its delay and error.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn retry_later(&self, owner: &str, retries: &[Retry]) -> Result<u64> {
        if retries.is_empty() {
            return Ok(0);
        }
        match &self.db {
            Db::Sqlite { writer, .. } => sqlite::retry_later(writer, owner, retries).await,
            Db::Postgres(pool) => postgres::retry_later(pool, owner, retries).await,
        }
    }

    /// Moves rows to `dead` with their reason, and enqueues their notices, in one
    /// transaction.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn dead_letter(&self, owner: &str, dead: &[DeadLetter]) -> Result<u64> {
        if dead.is_empty() {
            return Ok(0);
        }
        let notices: Vec<Message> = dead.iter().filter_map(|d| d.notice.clone()).collect();
        let mut tx = self.begin().await?;
        let n = match tx.conn() {
            Conn::Sqlite(c) => sqlite::dead_letter(c, owner, dead).await?,
            Conn::Postgres(c) => postgres::dead_letter(c, owner, dead).await?,
        };
        // A notice for a row that was not ours any more (lease lost) must not be sent.
        if n == dead.len() as u64 {
            // Notices skip the pending limit: they report on work already admitted.
            match tx.conn() {
                Conn::Sqlite(c) => sqlite::enqueue(c, &notices).await?,
                Conn::Postgres(c) => postgres::enqueue(c, &notices).await?,
            }
            tx.mark_enqueued();
        } else if dead.len() > 1 && !notices.is_empty() {
            tx.rollback().await?;
            // Some rows were lost: one row at a time, so each notice follows its own
            // row (a single row that was lost is committed below, without its notice).
            let mut total = 0;
            for d in dead {
                total += Box::pin(self.dead_letter(owner, std::slice::from_ref(d))).await?;
            }
            return Ok(total);
        }
        tx.commit().await?;
        Ok(n)
    }

    /// Returns claimed rows to `pending` without counting the attempt (graceful
    /// shutdown: they were never handed over).
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn release(&self, owner: &str, seqs: &[i64]) -> Result<u64> {
        if seqs.is_empty() {
            return Ok(0);
        }
        match &self.db {
            Db::Sqlite { writer, .. } => sqlite::release(writer, owner, seqs).await,
            Db::Postgres(pool) => postgres::release(pool, owner, seqs).await,
        }
    }

    /// Extends the leases of rows still held by `owner` (long deliveries).
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn renew_leases(&self, owner: &str, seqs: &[i64], lease: Duration) -> Result<u64> {
        if seqs.is_empty() {
            return Ok(0);
        }
        match &self.db {
            Db::Sqlite { writer, .. } => sqlite::renew(writer, owner, seqs, lease).await,
            Db::Postgres(pool) => postgres::renew(pool, owner, seqs, lease).await,
        }
    }

    /// Returns rows whose lease expired (their relay died) to the pool.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn reclaim_expired(&self) -> Result<u64> {
        match &self.db {
            Db::Sqlite { writer, .. } => sqlite::reclaim_expired(writer).await,
            Db::Postgres(pool) => postgres::reclaim_expired(pool).await,
        }
    }

    /// Re-drives one dead letter: pending again, attempts reset.
    ///
    /// # Errors
    /// [`Error::NotFound`] if `id` is not a dead letter.
    pub async fn redrive(&self, id: MessageId) -> Result<()> {
        let n = match &self.db {
            Db::Sqlite { writer, .. } => sqlite::redrive(writer, Some(id), None).await?,
            Db::Postgres(pool) => postgres::redrive(pool, Some(id), None).await?,
        };
        if n == 0 {
            return Err(Error::NotFound {
                what: "dead letter",
                id: id.to_string(),
            });
        }
        self.wake();
        Ok(())
    }

    /// Re-drives every dead letter, or those of one destination. Returns how many.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn redrive_all(&self, destination: Option<&str>) -> Result<u64> {
        let n = match &self.db {
            Db::Sqlite { writer, .. } => sqlite::redrive(writer, None, destination).await?,
            Db::Postgres(pool) => postgres::redrive(pool, None, destination).await?,
        };
        self.wake();
        Ok(n)
    }

    /// Deletes delivered rows delivered more than `older_than` ago.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn prune_delivered(&self, older_than: Duration) -> Result<u64> {
        match &self.db {
            Db::Sqlite { writer, .. } => sqlite::prune(writer, "delivered", older_than).await,
            Db::Postgres(pool) => postgres::prune(pool, "delivered", older_than).await,
        }
    }

    /// Deletes one dead letter (say, one whose saga has moved past it).
    ///
    /// # Errors
    /// [`Error::NotFound`] if no dead letter has this id; [`Error::Database`].
    pub async fn purge_dead_letter(&self, id: MessageId) -> Result<()> {
        let n = match &self.db {
            Db::Sqlite { writer, .. } => {
                sqlx::query("DELETE FROM outbox WHERE state = 'dead' AND id = ?1")
                    .bind(id.to_string())
                    .execute(writer)
                    .await?
                    .rows_affected()
            }
            Db::Postgres(pool) => {
                sqlx::query("DELETE FROM outbox WHERE state = 'dead' AND id = $1")
                    .bind(id.as_uuid())
                    .execute(pool)
                    .await?
                    .rows_affected()
            }
        };
        if n == 0 {
            return Err(Error::NotFound {
                what: "dead letter",
                id: id.to_string(),
            });
        }
        Ok(())
    }

    /// Deletes dead letters created more than `older_than` ago.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn purge_dead(&self, older_than: Duration) -> Result<u64> {
        match &self.db {
            Db::Sqlite { writer, .. } => sqlite::prune(writer, "dead", older_than).await,
            Db::Postgres(pool) => postgres::prune(pool, "dead", older_than).await,
        }
    }

    /// Deletes inbox records older than `older_than`. Keep them longer than any
    /// redelivery can take (leases, retries), or a late duplicate is processed again.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn prune_inbox(&self, older_than: Duration) -> Result<u64> {
        match &self.db {
            Db::Sqlite { writer, .. } => sqlite::prune(writer, "inbox", older_than).await,
            Db::Postgres(pool) => postgres::prune(pool, "inbox", older_than).await,
        }
    }

    /// Counts by state and the lag.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn stats(&self) -> Result<Stats> {
        match &self.db {
            Db::Sqlite { reader, .. } => sqlite::stats(reader).await,
            Db::Postgres(pool) => postgres::stats(pool).await,
        }
    }

    /// Dead letters, newest first, optionally of one destination.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn dead_letters(
        &self,
        destination: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DeadRow>> {
        match &self.db {
            Db::Sqlite { reader, .. } => sqlite::dead_letters(reader, destination, limit).await,
            Db::Postgres(pool) => postgres::dead_letters(pool, destination, limit).await,
        }
    }

    /// Closes the pools.
    pub async fn close(&self) {
        match &self.db {
            Db::Sqlite { writer, reader } => {
                reader.close().await;
                writer.close().await;
            }
            Db::Postgres(pool) => pool.close().await,
        }
    }
}

/// Milliseconds since the Unix epoch, the SQLite backend's clock.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

#[cfg(test)]
mod tests;
