//! A write transaction of the store, of either backend: what is the same on both (the
//! enqueue and the inbox, handover, the commit and its wake-ups). Each driver adds its
//! lane's side (`sqlite::tx`, `postgres::tx`).

use super::backend::Backend;
use super::types::{Inner, Store, Tx};
use super::write::Writes;
use super::{Conn, Receipt};
use crate::{Message, MessageId, Result};

impl Tx {
    pub(crate) async fn begin(store: &Store) -> Result<Self> {
        let inner = match store.backend_ref() {
            // IMMEDIATE takes the write lock up front: a deferred transaction that later
            // upgrades can fail with SQLITE_BUSY whatever the busy timeout (another
            // process writing). In this process the single writer connection already
            // queues writers.
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(db) => Inner::Sqlite(db.writer.begin_with("BEGIN IMMEDIATE").await?),
            #[cfg(feature = "postgres")]
            Backend::Postgres(db) => Inner::Postgres(db.pool.begin().await?),
        };
        Ok(Self::new(store, inner))
    }

    /// A transaction of `store` on `inner`, nothing written in it yet.
    pub(crate) fn new(store: &Store, inner: Inner) -> Self {
        Self {
            inner,
            store: store.clone(),
            enqueued: false,
            handed: super::handover::Handed::default(),
            defer: false,
            #[cfg(feature = "sqlite")]
            tail: None,
            #[cfg(feature = "postgres")]
            sets: None,
            unchecked: false,
        }
    }

    /// A hop of SQLite's lane ([`begin_lane`](Self::begin_lane)): its hops may defer
    /// their last write, and its statements run on the connection directly.
    pub(crate) fn in_lane(&self) -> bool {
        #[cfg(feature = "sqlite")]
        {
            self.is_lane()
        }
        #[cfg(not(feature = "sqlite"))]
        {
            false
        }
    }

    /// See [`Hop::defer_next_write`](super::Hop::defer_next_write): only a hop may
    /// defer its last write.
    pub(crate) fn defer_next_write(&mut self) {
        self.defer = self.in_lane();
        #[cfg(feature = "postgres")]
        if let Some(kept) = &mut self.sets {
            kept.deferrable = true;
        }
    }

    /// The connection, for the caller's own statements in this transaction.
    ///
    /// A statement of yours that fails aborts the transaction on PostgreSQL even if
    /// you ignore its error: [`commit`](Self::commit) then fails with
    /// [`Error::RolledBack`](crate::Error::RolledBack) (nothing was written), never
    /// reports success. Use a savepoint for a statement whose failure you tolerate.
    pub fn conn(&mut self) -> Conn<'_> {
        self.unchecked = true;
        self.conn_marked()
    }

    /// The connection, for the store's own statements that a hop of the set lane
    /// counts as its writes (its savepoints then guard it).
    pub(crate) fn conn_marked(&mut self) -> Conn<'_> {
        #[cfg(feature = "postgres")]
        if let Some(kept) = &mut self.sets {
            kept.dirty = true;
        }
        self.conn_clean()
    }

    /// A statement of the store's failed in this transaction: its caller may swallow
    /// the error and commit, so the commit must probe.
    pub(crate) fn suspect<T>(&mut self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.unchecked = true;
        }
        r
    }

    /// The connection, for the store's own statements (not the caller's: a hop of
    /// the set lane stays clean).
    pub(crate) fn conn_clean(&mut self) -> Conn<'_> {
        #[cfg(feature = "sqlite")]
        {
            debug_assert!(
                self.tail.is_none(),
                "a statement after a hop's deferred last write"
            );
        }
        match &mut self.inner {
            #[cfg(feature = "sqlite")]
            Inner::Sqlite(tx) => Conn::Sqlite(&mut *tx),
            #[cfg(feature = "sqlite")]
            // sqlx's thread runs what comes next: the lane's lock given back to it.
            Inner::Lane(lane) => Conn::Sqlite(lane.sqlx()),
            #[cfg(feature = "postgres")]
            Inner::Postgres(tx) => Conn::Postgres(&mut *tx),
        }
    }

    /// `"sqlite"` or `"postgres"`: the backend of this transaction (without taking its
    /// connection, as [`conn`](Self::conn) does).
    pub fn backend(&self) -> &'static str {
        match &self.inner {
            #[cfg(feature = "sqlite")]
            Inner::Sqlite(_) | Inner::Lane(_) => "sqlite",
            #[cfg(feature = "postgres")]
            Inner::Postgres(_) => "postgres",
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
        self.enqueue_batch(std::slice::from_ref(message)).await?;
        Ok(message.id)
    }

    /// Enqueues several messages in one statement. See [`Store::enqueue_batch`].
    ///
    /// # Errors
    /// As [`Store::enqueue`].
    pub async fn enqueue_batch(&mut self, messages: &[Message]) -> Result<()> {
        let r = self.enqueue_batch_unchecked(messages).await;
        self.suspect(r)
    }

    /// [`enqueue_batch`](Self::enqueue_batch), its failure not yet marked for the
    /// commit's probe.
    async fn enqueue_batch_unchecked(&mut self, messages: &[Message]) -> Result<()> {
        let store = self.store.clone();
        if let Some(to) = store.handover()
            && messages.iter().any(|m| m.delay.is_zero())
        {
            // On PostgreSQL, many messages in at most two statements (those handed
            // over, leased; the rest) instead of one per message handed over.
            #[cfg(feature = "postgres")]
            if self.backend() == "postgres"
                && messages.len() > 1
                && self.sets.is_none()
                && store.config().max_pending.is_none()
            {
                for m in messages {
                    store.validate(m)?;
                }
                let span = crate::propagation::enqueue_span(messages, true);
                let write = self.write_messages(&store, messages.to_vec());
                return tracing::Instrument::instrument(write, span).await;
            }
            return self.enqueue_handing(&store, &to, messages).await;
        }
        store.enqueue_batch(self.conn_marked(), messages).await?;
        self.enqueued = true;
        Ok(())
    }

    /// Enqueues in order, writing each message that `to` takes leased to it (handed
    /// over when this transaction commits), the others `pending`, in runs.
    async fn enqueue_handing(
        &mut self,
        store: &Store,
        to: &std::sync::Arc<dyn super::Handover>,
        messages: &[Message],
    ) -> Result<()> {
        for m in messages {
            store.validate(m)?;
        }
        let mut run = 0;
        for (i, m) in messages.iter().enumerate() {
            if !m.delay.is_zero() || !to.reserve(&m.destination) {
                continue;
            }
            if run < i {
                store
                    .enqueue_valid(self.conn_marked(), &messages[run..i])
                    .await?;
                self.enqueued = true;
            }
            run = i + 1;
            // Before the statement: the row's lease begins there or later.
            let leased_at = std::time::Instant::now();
            match store
                .enqueue_leased(self.conn_marked(), m, to.as_ref())
                .await
            {
                Ok(Some(row)) => self.handed.push(std::sync::Arc::clone(to), row, leased_at),
                Ok(None) => {
                    // Its key has a live row (it waits its turn) or its id is stored.
                    to.cancel(&m.destination);
                    store
                        .enqueue_valid(self.conn_marked(), std::slice::from_ref(m))
                        .await?;
                    self.enqueued = true;
                }
                Err(e) => {
                    to.cancel(&m.destination);
                    return Err(e);
                }
            }
        }
        if run < messages.len() {
            store
                .enqueue_valid(self.conn_marked(), &messages[run..])
                .await?;
            self.enqueued = true;
        }
        Ok(())
    }

    /// A mark of the rows to hand over so far (a hop's savepoint).
    pub(crate) fn handed_mark(&self) -> usize {
        self.handed.mark()
    }

    /// The savepoint of `mark` was rolled back: its rows are not handed over.
    pub(crate) fn cancel_handed_since(&mut self, mark: usize) {
        self.handed.cancel_since(mark);
    }

    /// Records the receipt of a message in this transaction. See [`Store::receive`].
    ///
    /// # Errors
    /// As [`Store::receive`].
    pub async fn receive(&mut self, consumer: &str, message_id: MessageId) -> Result<Receipt> {
        let store = self.store.clone();
        let r = store
            .receive(self.conn_marked(), consumer, message_id)
            .await;
        self.suspect(r)
    }

    /// Deletes still-pending messages in this transaction. See [`Store::cancel_pending`].
    ///
    /// # Errors
    /// As [`Store::cancel_pending`].
    pub async fn cancel_pending(&mut self, ids: &[MessageId]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let store = self.store.clone();
        let r = store.cancel_pending(self.conn_marked(), ids).await;
        self.suspect(r)
    }

    /// Runs a savepoint statement (`SAVEPOINT x`, `ROLLBACK TO SAVEPOINT x`,
    /// `RELEASE SAVEPOINT x`) in this transaction.
    pub(crate) async fn savepoint_op(&mut self, sql: &'static str) -> Result<()> {
        self.execute(sql).await
    }

    pub(crate) async fn execute(&mut self, sql: &'static str) -> Result<()> {
        use sqlx::Executor;
        #[cfg(feature = "sqlite")]
        if let Inner::Lane(lane) = &mut self.inner
            && let Some(session) = lane.locked()
        {
            // The lane's savepoints, while it holds the connection.
            return session.run(&crate::sqlite::statements::Statement::plain(sql), |_| {});
        }
        match self.conn_clean() {
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(c) => {
                c.execute(sql).await?;
            }
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => {
                c.execute(sql).await?;
            }
        }
        Ok(())
    }

    pub(crate) fn mark_enqueued(&mut self) {
        self.enqueued = true;
    }

    /// Commits, then wakes the relays if anything was enqueued.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) if the commit fails; nothing was
    /// written then.
    pub async fn commit(mut self) -> Result<()> {
        #[cfg(feature = "sqlite")]
        if let Inner::Lane(_) = self.inner {
            return self.end_lane(true).await;
        }
        match self.inner {
            #[cfg(feature = "sqlite")]
            Inner::Sqlite(tx) => tx.commit().await?,
            #[cfg(feature = "sqlite")]
            Inner::Lane(_) => {} // ended above
            #[cfg(feature = "postgres")]
            Inner::Postgres(mut tx) => {
                // PostgreSQL answers the COMMIT of an aborted transaction with the
                // tag ROLLBACK, and sqlx reports it as success. An aborted transaction
                // refuses every statement but its end: one is enough to tell.
                if self.unchecked
                    && let Err(e) = sqlx::Executor::execute(&mut *tx, "SELECT 1").await
                {
                    let _ = tx.rollback().await;
                    return Err(rolled_back(e));
                }
                tx.commit().await?
            }
        }
        Self::after_commit(&self.store, &mut self.handed, self.enqueued);
        Ok(())
    }

    /// After a commit: the checkpointer poked (SQLite), the rows written leased handed
    /// over, the relays woken if anything was enqueued.
    pub(crate) fn after_commit(
        store: &Store,
        handed: &mut super::handover::Handed,
        enqueued: bool,
    ) {
        #[cfg(feature = "sqlite")]
        #[allow(irrefutable_let_patterns)]
        if let Backend::Sqlite(db) = store.backend_ref()
            && let Some(c) = &db.checkpoints
        {
            c.poke();
        }
        handed.commit();
        if enqueued {
            store.wake();
        }
    }

    /// Rolls back: nothing enqueued in it ever existed.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error.
    #[cfg_attr(not(feature = "sqlite"), allow(unused_mut))]
    pub async fn rollback(mut self) -> Result<()> {
        #[cfg(feature = "sqlite")]
        if let Inner::Lane(_) = self.inner {
            return self.end_lane(false).await;
        }
        match self.inner {
            #[cfg(feature = "sqlite")]
            Inner::Sqlite(tx) => tx.rollback().await?,
            #[cfg(feature = "sqlite")]
            Inner::Lane(_) => {} // ended above
            #[cfg(feature = "postgres")]
            Inner::Postgres(tx) => tx.rollback().await?,
        }
        Ok(())
    }
}

/// The error of a commit whose probe failed: 25P02 (the transaction was aborted by an
/// earlier statement) is [`Error::RolledBack`]; anything else (the connection lost)
/// is the database's error, nothing written either way.
#[cfg(feature = "postgres")]
fn rolled_back(e: sqlx::Error) -> crate::Error {
    match &e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("25P02") => {
            crate::Error::RolledBack
        }
        _ => crate::Error::Database(e),
    }
}

impl Tx {
    /// Writes `writes` now: its rows (one statement per table on SQLite, one for all
    /// the tables on PostgreSQL), then its messages, as [`enqueue_batch`](Self::enqueue_batch)
    /// does (direct handover included); on SQLite in one round trip.
    ///
    /// # Errors
    /// [`Error::Corrupt`](crate::Error::Corrupt) for a row that does not fit its table (nothing written); as
    /// [`enqueue_batch`](Self::enqueue_batch); the database's error of a row (roll the
    /// transaction back: some rows may have been written).
    pub async fn write(&mut self, writes: Writes) -> Result<()> {
        self.write_as(writes, false).await
    }

    /// [`write`](Self::write) for the hop's last write: in a hop that allowed it
    /// ([`Hop::defer_next_write`](crate::Hop::defer_next_write)) the driver may run it later, in
    /// the round trip that ends the hop (SQLite's lane), or keep it as data for the
    /// batch's statements (PostgreSQL's set lane). Its errors then come from
    /// [`Hop::commit`](crate::Hop::commit), and the hop is undone. Run no statement
    /// after it in the same hop.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub async fn write_last(&mut self, writes: Writes) -> Result<()> {
        self.write_as(writes, true).await
    }

    /// The one match on the backend of a write: each driver runs it its way.
    async fn write_as(&mut self, writes: Writes, last: bool) -> Result<()> {
        writes.check()?;
        match self.inner {
            #[cfg(feature = "sqlite")]
            Inner::Sqlite(_) | Inner::Lane(_) => {
                crate::sqlite::write::write(self, writes, last).await
            }
            #[cfg(feature = "postgres")]
            Inner::Postgres(_) => crate::postgres::write::write(self, writes, last).await,
        }
    }
}
