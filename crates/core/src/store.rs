//! The store: one handle over the outbox and inbox tables of a SQLite or PostgreSQL
//! database, with the embedded migrations applied on open.
//!
//! The API comes in three layers, one per audience:
//! - producers and consumers: [`Store`] and [`Tx`] (enqueue in a transaction, receive
//!   into the inbox);
//! - the relay's protocol: [`queue`], through [`Store::queue`];
//! - the operator's calls: [`admin`], through [`Store::admin`].
//!
//! Each backend is a driver of its own (`crate::sqlite`, `crate::postgres`): its
//! database, statements, lane and notifications. The store names them in one place,
//! the [`Backend`](backend::Backend) enum and the macros beside it; everything else
//! here is written once for both.

pub mod admin;
pub(crate) mod admin_types;
pub(crate) mod backend;
pub(crate) mod config;
pub(crate) mod conn;
pub(crate) mod crash_hook;
pub(crate) mod exclusive;
pub(crate) mod handover;
pub(crate) mod hop;
mod macros;
pub(crate) mod prefetch;
pub mod queue;
pub(crate) mod queue_types;
pub(crate) mod row;
pub(crate) mod schema;
pub(crate) mod tx;
pub(crate) mod types;
pub(crate) mod wake;
pub mod write;

#[cfg(feature = "postgres")]
use sqlx::PgPool;
#[cfg(feature = "sqlite")]
use sqlx::SqlitePool;
use tracing::Instrument;

pub use config::{StoreConfig, Synchronous};
pub(crate) use conn::Integer;
pub use conn::{Conn, Receipt};
pub use exclusive::Exclusive;
pub use handover::Handover;
pub use prefetch::{Prefetch, Prefetched};
pub use row::Row;
pub use types::{Hop, HopStats, Installed, Store, Tx};

use self::backend::{Backend, Dialect, on_backend, on_conn};
use self::wake::Wakeups;
use crate::propagation::enqueue_span;
use crate::{Error, Message, MessageId, Result};

/// A pool to read with, for code that runs its own queries (the saga engine's reports,
/// the CLI). On a SQLite file its connections are read-only; writes go through
/// [`Store::begin`], which queues them for the single writer.
#[derive(Clone, Copy, Debug)]
pub enum ReadPool<'a> {
    /// SQLite's readers (the writer itself for `sqlite::memory:`).
    #[cfg(feature = "sqlite")]
    Sqlite(&'a SqlitePool),
    /// PostgreSQL's pool.
    #[cfg(feature = "postgres")]
    Postgres(&'a PgPool),
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
        let (backend, wake) = Backend::open(url, &config).await?;
        Ok(Self {
            backend,
            config: std::sync::Arc::new(config),
            wake,
            lanes: types::Lanes::default(),
            handover: handover::Slot::default(),
        })
    }

    /// A pool to read with, for queries of your own. Write through
    /// [`begin`](Self::begin).
    pub fn reader(&self) -> ReadPool<'_> {
        match &self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(db) => ReadPool::Sqlite(&db.reader),
            #[cfg(feature = "postgres")]
            Backend::Postgres(db) => ReadPool::Postgres(&db.pool),
        }
    }

    /// Runs `read` on a pooled read connection, outside any transaction: the reads of
    /// code that also runs them inside a transaction (through a [`Conn`]).
    ///
    /// # Errors
    /// [`Error::Database`] if no connection can be had; else what `read` returns.
    pub async fn read<T>(&self, read: impl AsyncFnOnce(Conn<'_>) -> Result<T>) -> Result<T> {
        match &self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(db) => read(Conn::Sqlite(&mut *db.reader.acquire().await?)).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(db) => read(Conn::Postgres(&mut *db.pool.acquire().await?)).await,
        }
    }

    pub(crate) fn backend_ref(&self) -> &Backend {
        &self.backend
    }

    /// The file of a SQLite database (`None` on PostgreSQL and for an in-memory one).
    pub fn sqlite_file(&self) -> Option<std::path::PathBuf> {
        match &self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(db) => {
                // The writer runs in journal mode WAL exactly when the database is a
                // file (see `sqlite::open_once`); an in-memory one has no file to share.
                let options = db.writer.connect_options();
                let path = options.get_filename();
                let name = path.to_string_lossy();
                (db.checkpoints.is_some() && !name.is_empty() && !name.contains(":memory:"))
                    .then(|| path.to_path_buf())
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => None,
        }
    }

    /// The file a SQLite URL names, read from the URL alone, before anything opens or
    /// creates it: `None` for an in-memory SQLite database, a PostgreSQL URL, or a URL
    /// this build cannot parse (which [`connect`](Self::connect) then refuses).
    pub fn sqlite_file_of(url: &str) -> Option<std::path::PathBuf> {
        #[cfg(feature = "sqlite")]
        if url.split(':').next() == Some("sqlite") {
            return crate::sqlite::file_of(url);
        }
        let _ = url;
        None
    }

    /// `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        match self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => "sqlite",
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => "postgres",
        }
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
        async {
            on_conn!(conn, D, c => D::enqueue_leased(c, message, to.owner(), to.lease()).await)
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
        on_conn!(conn, D, c => {
            if let Some(limit) = max_pending {
                let pending = D::count_pending(c, limit).await?;
                if pending + messages.len() as u64 > limit {
                    return Err(Error::QueueFull { pending, limit });
                }
            }
            D::enqueue(c, messages).await
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
        let inserted = on_conn!(conn, D, c => D::receive(c, consumer, message_id).await?);
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
        on_conn!(conn, D, c => D::cancel_pending(c, ids).await)
    }

    /// Wakes the relays: call after committing a transaction of your own that enqueued
    /// (or commit it with [`Store::commit`], which does).
    pub fn wake(&self) {
        self.wake.wake();
    }

    fn check_backend<'c>(&self, conn: Conn<'c>) -> Result<Conn<'c>> {
        #[allow(unreachable_patterns)] // with one backend compiled, every pair matches
        match (&self.backend, &conn) {
            #[cfg(feature = "sqlite")]
            (Backend::Sqlite(_), Conn::Sqlite(_)) => Ok(conn),
            #[cfg(feature = "postgres")]
            (Backend::Postgres(_), Conn::Postgres(_)) => Ok(conn),
            _ => Err(Error::BackendMismatch {
                store: self.backend(),
                connection: conn.backend(),
            }),
        }
    }

    /// Closes the pools.
    pub async fn close(&self) {
        on_backend!(&self.backend, b => b.close().await);
    }
}

#[cfg(test)]
mod tests;
