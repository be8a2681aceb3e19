//! The store: one handle over the outbox and inbox tables of a SQLite or PostgreSQL
//! database, with the embedded migrations applied on open.
//!
//! The API comes in three layers, one per audience:
//! - producers and consumers: [`Store`] and [`Tx`] (enqueue in a transaction, receive
//!   into the inbox);
//! - the relay's protocol: [`queue`], through [`Store::queue`];
//! - the operator's calls: [`admin`], through [`Store::admin`].
//!
//! Each backend is a driver of its own, in its folder under `drivers/`: its database,
//! statements, transactions, lane and notifications. The store names none of them:
//! `crate::drivers` chooses the driver, and everything here is written once, for any
//! driver, through the traits of [`backend`].

pub mod admin;
pub(crate) mod admin_types;
pub(crate) mod backend;
pub(crate) mod config;
pub(crate) mod conn;
pub(crate) mod crash_hook;
pub(crate) mod crash_point;
pub(crate) mod exclusive;
pub(crate) mod handover;
pub(crate) mod hop;
pub(crate) mod prefetch;
pub mod queue;
pub(crate) mod queue_types;
pub mod read;
pub(crate) mod row;
pub(crate) mod schema;
pub mod sql;
#[cfg(feature = "testing")]
pub(crate) mod test_clock;
pub(crate) mod tx;
pub(crate) mod types;
pub(crate) mod wake;
pub mod write;

use tracing::Instrument;

pub use config::{StoreConfig, Synchronous};
pub(crate) use conn::Integer;
pub use conn::{Conn, ReadPool, Receipt};
pub use exclusive::Exclusive;
pub use handover::Handover;

pub use row::Row;
pub use sql::Sql;
pub use types::{Hop, HopStats, Installed, Store, Tx};

use self::backend::{Dialect, Driver};
use self::wake::Wakeups;
use crate::drivers::{Backend, on_backend, on_conn, on_reader};
use crate::propagation::enqueue_span;
use crate::{Error, Message, MessageId, Result};

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
    /// [`Error::SchemaTooNew`] if a newer agentsaga migrated it,
    /// [`Error::ManualClockNeedsAFreshDatabase`] for a manual clock on a PostgreSQL
    /// database migrated without one.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, StoreConfig::default()).await
    }

    /// Like [`connect`](Self::connect), with a configuration.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn connect_with(url: &str, config: StoreConfig) -> Result<Self> {
        let (backend, wake) = Backend::open(url, &config).await?;
        Ok(Self {
            backend,
            config: std::sync::Arc::new(config),
            wake,
            lanes: types::Lanes::default(),
            handover: handover::Slot::default(),
        })
    }

    /// The runtime's one clock ([`StoreConfig::clock`]): every layer built on this store
    /// reads its time here.
    pub fn clock(&self) -> &crate::clock::Clock {
        &self.config.clock
    }

    /// A pool to read with, for queries of your own ([`Sql`](crate::Sql)). Write through
    /// [`begin`](Self::begin).
    pub fn reader(&self) -> ReadPool<'_> {
        ReadPool(
            on_backend!(&self.backend, b => b.reader()),
            &self.config.clock,
        )
    }

    /// Runs `read` on a pooled read connection, outside any transaction: the reads of
    /// code that also runs them inside a transaction (through a [`Conn`]).
    ///
    /// # Errors
    /// [`Error::Database`] if no connection can be had; else what `read` returns.
    pub async fn read<T>(&self, read: impl AsyncFnOnce(Conn<'_>) -> Result<T>) -> Result<T> {
        on_reader!(self.reader().0, D, p => read(Conn::from(&mut *p.acquire().await?)).await)
    }

    pub(crate) fn backend_ref(&self) -> &Backend {
        &self.backend
    }

    /// The file of the database, for a driver whose database is a file (SQLite's;
    /// `None` on PostgreSQL and for an in-memory database).
    pub fn database_file(&self) -> Option<std::path::PathBuf> {
        on_backend!(&self.backend, b => b.file())
    }

    /// The file a SQLite URL names, read from the URL alone, before anything opens or
    /// creates it: `None` for an in-memory SQLite database, a PostgreSQL URL, or a URL
    /// this build cannot parse (which [`connect`](Self::connect) then refuses).
    pub fn database_file_of(url: &str) -> Option<std::path::PathBuf> {
        Backend::file_of(url)
    }

    /// The migrations this build embeds for its driver, all applied when it opened.
    pub fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        on_backend!(&self.backend, b => b.migrator())
    }

    /// The name of its driver: `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        on_backend!(&self.backend, b => b.name())
    }

    /// Installs a direct handover (see the [`handover`](crate::handover) module): from
    /// now on, a [`Tx`] of this store (or of a clone) writes messages it can hand over
    /// leased to it, and hands them over on commit. Replaces the one installed before.
    /// Dropping what it returns removes it again (if it is still the one installed):
    /// messages are then written `pending`, for the relays to claim.
    #[must_use = "the handover is removed when this is dropped"]
    pub fn install_handover(
        &self,
        handover: std::sync::Arc<dyn Handover>,
    ) -> crate::handover::Installed {
        self.set_handover(std::sync::Arc::clone(&handover));
        crate::handover::Installed::new(self.clone(), handover)
    }

    pub(crate) fn set_handover(&self, handover: std::sync::Arc<dyn Handover>) {
        self.handover.set(Some(handover));
    }

    pub(crate) fn remove_handover(&self, handover: &std::sync::Arc<dyn Handover>) {
        self.handover.remove(handover);
    }

    pub(crate) fn handover(&self) -> Option<std::sync::Arc<dyn Handover>> {
        self.handover.get()
    }

    /// Writes `message` leased to `to` if it can be handed over (see
    /// [`Dialect::enqueue_leased`]); validated already.
    pub(crate) async fn enqueue_leased(
        &self,
        conn: Conn<'_>,
        message: &Message,
        to: &dyn Handover,
    ) -> Result<Option<crate::Envelope>> {
        let conn = self.check_backend(conn)?;
        let (now, lease_now) = self.clock().now_and_lease_ms();
        async {
            on_conn!(conn.0, D, c => D::enqueue_leased(c, message, to.owner(), to.lease(), now, lease_now).await)
        }
        .instrument(enqueue_span(std::slice::from_ref(message), true))
        .await
    }

    /// Rejects a message that no enqueue would take.
    pub(crate) fn validate(&self, message: &Message) -> Result<()> {
        crate::message::validate(message, self.config.max_message_bytes)
    }

    /// Would an enqueue on this store take `message`? The checks [`enqueue`](Self::enqueue)
    /// makes before it writes anything: a destination, the size limit
    /// ([`StoreConfig::max_message_bytes`]), a JSON payload. For a producer that must
    /// know now that a message it will write later is acceptable (a saga start that
    /// waits for room).
    ///
    /// # Errors
    /// [`Error::EmptyDestination`], [`Error::PayloadTooLarge`], [`Error::Json`].
    pub fn check_message(&self, message: &Message) -> Result<()> {
        self.validate(message)
    }

    /// The configuration in force.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Wakeups: relays subscribe here to learn of new messages at once.
    pub fn wakeups(&self) -> &Wakeups {
        &self.wake
    }

    /// Writes `message` to the outbox through `conn`, which is (part of) the caller's
    /// own transaction: it exists once that transaction commits, and never if it rolls
    /// back. Enqueueing an id that is already stored is a no-op.
    ///
    /// Commit that transaction with [`Store::commit`], which also wakes the relays; a
    /// transaction committed otherwise leaves the message to the relay's next poll
    /// (call [`Store::wake`] after it). A [`Tx`] of the store does this by itself.
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
            self.validate(m)?;
        }
        self.enqueue_valid(conn.into(), messages).await
    }

    /// [`enqueue_batch`](Self::enqueue_batch) of messages validated already.
    pub(crate) async fn enqueue_valid(&self, conn: Conn<'_>, messages: &[Message]) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        self.enqueue_checked(conn, messages)
            .instrument(enqueue_span(messages, false))
            .await
    }

    async fn enqueue_checked(&self, conn: Conn<'_>, messages: &[Message]) -> Result<()> {
        let conn = self.check_backend(conn)?;
        let max_pending = self.config.max_pending;
        let now = self.clock().now_ms();
        on_conn!(conn.0, D, c => {
            if let Some(limit) = max_pending {
                let pending = D::count_pending(c, limit).await?;
                if pending + messages.len() as u64 > limit {
                    return Err(Error::QueueFull { pending, limit });
                }
            }
            D::enqueue(c, messages, now).await
        })
    }

    /// Commits the caller's own sqlx transaction, then wakes the relays: the one call
    /// that ends a transaction in which [`enqueue`](Self::enqueue) wrote.
    ///
    /// # Errors
    /// [`Error::Database`] if the commit fails; nothing was written then.
    pub async fn commit<DB: sqlx::Database>(&self, tx: sqlx::Transaction<'_, DB>) -> Result<()> {
        tx.commit().await?;
        self.wake();
        Ok(())
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
        let conn = self.check_backend(conn.into())?;
        let now = self.clock().now_ms();
        let inserted = on_conn!(conn.0, D, c => D::receive(c, consumer, message_id, now).await?);
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
        on_backend!(&self.backend, b => b.seen(consumer, message_id).await)
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
        let conn = self.check_backend(conn.into())?;
        on_conn!(conn.0, D, c => D::cancel_pending(c, ids).await)
    }

    /// Wakes the relays: call after committing a transaction of your own that enqueued
    /// (or commit it with [`Store::commit`], which does).
    pub fn wake(&self) {
        self.wake.wake();
    }

    fn check_backend<'c>(&self, conn: Conn<'c>) -> Result<Conn<'c>> {
        if conn.backend() == self.backend() {
            Ok(conn)
        } else {
            Err(Error::BackendMismatch {
                store: self.backend(),
                connection: conn.backend(),
            })
        }
    }

    /// Closes the pools.
    pub async fn close(&self) {
        on_backend!(&self.backend, b => b.close().await);
    }
}

#[cfg(test)]
mod tests;
