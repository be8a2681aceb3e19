//! Connections and transactions of either backend.

use sqlx::{PgConnection, Postgres, Sqlite, SqliteConnection, Transaction};

use super::backend::Backend;
use super::{Receipt, Store};
use crate::{Message, MessageId, Result};

/// A borrowed connection of either backend, usually the inside of a transaction.
/// `&mut *tx` of a `sqlx::Transaction` converts into it, so the outbox joins the
/// caller's own transaction.
#[derive(Debug)]
pub enum Conn<'a> {
    /// A SQLite connection.
    Sqlite(&'a mut SqliteConnection),
    /// A PostgreSQL connection.
    Postgres(&'a mut PgConnection),
}

impl Conn<'_> {
    /// `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        match self {
            Conn::Sqlite(_) => "sqlite",
            Conn::Postgres(_) => "postgres",
        }
    }
}

impl<'a> From<&'a mut SqliteConnection> for Conn<'a> {
    fn from(c: &'a mut SqliteConnection) -> Self {
        Conn::Sqlite(c)
    }
}

impl<'a> From<&'a mut PgConnection> for Conn<'a> {
    fn from(c: &'a mut PgConnection) -> Self {
        Conn::Postgres(c)
    }
}

#[derive(Debug)]
enum Inner {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
}

/// A write transaction of the store. Dropping it without committing rolls it back.
#[derive(Debug)]
#[must_use = "a transaction that is not committed is rolled back"]
pub struct Tx {
    inner: Inner,
    store: Store,
    enqueued: bool,
}

impl Tx {
    pub(super) async fn begin(store: &Store) -> Result<Self> {
        let inner = match store.backend_ref() {
            // IMMEDIATE takes the write lock up front: a deferred transaction that later
            // upgrades can fail with SQLITE_BUSY whatever the busy timeout (another
            // process writing). In this process the single writer connection already
            // queues writers.
            Backend::Sqlite(db) => Inner::Sqlite(db.writer.begin_with("BEGIN IMMEDIATE").await?),
            Backend::Postgres(db) => Inner::Postgres(db.pool.begin().await?),
        };
        Ok(Self {
            inner,
            store: store.clone(),
            enqueued: false,
        })
    }

    /// The connection, for the caller's own statements in this transaction.
    pub fn conn(&mut self) -> Conn<'_> {
        match &mut self.inner {
            Inner::Sqlite(tx) => Conn::Sqlite(&mut *tx),
            Inner::Postgres(tx) => Conn::Postgres(&mut *tx),
        }
    }

    /// The store this transaction belongs to.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Enqueues a message in this transaction. See [`Store::enqueue`].
    ///
    /// # Errors
    /// As [`Store::enqueue`].
    pub async fn enqueue(&mut self, message: &Message) -> Result<MessageId> {
        let store = self.store.clone();
        let id = store.enqueue(self.conn(), message).await?;
        self.enqueued = true;
        Ok(id)
    }

    /// Enqueues several messages in one statement. See [`Store::enqueue_batch`].
    ///
    /// # Errors
    /// As [`Store::enqueue`].
    pub async fn enqueue_batch(&mut self, messages: &[Message]) -> Result<()> {
        let store = self.store.clone();
        store.enqueue_batch(self.conn(), messages).await?;
        self.enqueued = true;
        Ok(())
    }

    /// Records the receipt of a message in this transaction. See [`Store::receive`].
    ///
    /// # Errors
    /// As [`Store::receive`].
    pub async fn receive(&mut self, consumer: &str, message_id: MessageId) -> Result<Receipt> {
        let store = self.store.clone();
        store.receive(self.conn(), consumer, message_id).await
    }

    /// Deletes still-pending messages in this transaction. See [`Store::cancel_pending`].
    ///
    /// # Errors
    /// As [`Store::cancel_pending`].
    pub async fn cancel_pending(&mut self, ids: &[MessageId]) -> Result<u64> {
        let store = self.store.clone();
        store.cancel_pending(self.conn(), ids).await
    }

    pub(super) fn mark_enqueued(&mut self) {
        self.enqueued = true;
    }

    /// Commits, then wakes the relays if anything was enqueued.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) if the commit fails; nothing was
    /// written then.
    pub async fn commit(self) -> Result<()> {
        match self.inner {
            Inner::Sqlite(tx) => tx.commit().await?,
            Inner::Postgres(tx) => tx.commit().await?,
        }
        if self.enqueued {
            self.store.wake();
        }
        Ok(())
    }

    /// Rolls back: nothing enqueued in it ever existed.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error.
    pub async fn rollback(self) -> Result<()> {
        match self.inner {
            Inner::Sqlite(tx) => tx.rollback().await?,
            Inner::Postgres(tx) => tx.rollback().await?,
        }
        Ok(())
    }
}

/// Runs the same code on a [`Conn`] of either backend: `$c` is the backend's
/// `&mut` connection in each arm. For statements whose text and binds suit both (sqlx
/// numbers parameters `$1, $2, …` on SQLite too).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), agentsaga_core::Error> {
/// let store = agentsaga_core::Store::connect("sqlite::memory:").await?;
/// let mut tx = store.begin().await?;
/// let n: i64 = agentsaga_core::with_conn!(tx.conn(), c => {
///     agentsaga_core::sqlx::query_scalar("SELECT count(*) FROM outbox WHERE destination = $1")
///         .bind("billing")
///         .fetch_one(c)
///         .await?
/// });
/// assert_eq!(n, 0);
/// # Ok(()) }
/// ```
#[macro_export]
macro_rules! with_conn {
    ($conn:expr, $c:ident => $body:expr) => {
        match $conn {
            $crate::Conn::Sqlite($c) => $body,
            $crate::Conn::Postgres($c) => $body,
        }
    };
}

/// Runs the same code on a [`ReadPool`](crate::ReadPool) of either backend: `$p` is the
/// backend's pool in each arm. See [`with_conn!`](crate::with_conn).
#[macro_export]
macro_rules! with_reader {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            $crate::ReadPool::Sqlite($p) => $body,
            $crate::ReadPool::Postgres($p) => $body,
        }
    };
}
