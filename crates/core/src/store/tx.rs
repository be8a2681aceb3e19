//! A write transaction of the store, of any driver: what is the same on all (the
//! enqueue and the inbox, handover, the commit and its wake-ups). Each driver adds its
//! transaction and its lane's side, in its folder's `tx.rs`, through
//! [`Driver`](super::backend::Driver).

use super::backend::{Driver, DriverTx};
use super::types::{Store, Tx};
use super::write::Writes;
use super::{Conn, Receipt};
use crate::drivers::{TxOf, on_backend, on_tx, on_tx_driver};
use crate::{Message, MessageId, Result};

impl Tx {
    pub(crate) async fn begin(store: &Store) -> Result<Self> {
        on_backend!(store.backend_ref(), b => b.begin_tx(store).await)
    }

    /// A transaction of `store` on `inner`, nothing written in it yet.
    pub(crate) fn new(store: &Store, inner: TxOf) -> Self {
        Self {
            inner,
            store: store.clone(),
            enqueued: false,
            handed: super::handover::Handed::default(),
            defer: false,
            unchecked: false,
            touched: false,
        }
    }

    /// See [`Hop::defer_next_write`](super::Hop::defer_next_write): only a hop may
    /// defer its last write.
    pub(crate) fn defer_next_write(&mut self) {
        self.defer = on_tx!(&mut self.inner, t => t.allow_defer());
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
        self.touched = true;
        on_tx!(&mut self.inner, t => t.mark_written());
        self.conn_clean()
    }

    /// Runs `sql`, a read, in this transaction: its rows. For agentsaga's engine (its
    /// reads in a hop: a tree's budgets, a saga's signals), not for handlers: use
    /// [`conn`](Self::conn). Unlike a statement through `conn`, a read that succeeds
    /// needs no savepoint on PostgreSQL's set lane, and runs on SQLite's lane on the
    /// connection directly. A read that fails counts as a statement through `conn` (on
    /// PostgreSQL it failed the transaction: the hop's batch undoes it, or the commit
    /// probes). A statement that names a write or a row lock is refused
    /// ([`Error::NotARead`](crate::Error::NotARead)); one that writes through a
    /// function it calls is not seen, and on the set lane would not be undone with its
    /// hop. Run no read after a deferred last write ([`write_last`](Self::write_last)):
    /// it would not see it.
    ///
    /// # Errors
    /// As [`Sql::fetch_all`](crate::Sql::fetch_all); [`Error::NotARead`](crate::Error::NotARead).
    #[doc(hidden)]
    pub async fn read(&mut self, sql: &crate::Sql) -> Result<Vec<crate::Row>> {
        if sql.for_update || !is_a_read(&sql.text) {
            return Err(crate::Error::NotARead(sql.text.to_string()));
        }
        // A hop that read is not reused for a failure (`Hop::is_untouched`): what a
        // read called may have written. Marked before the statement, which a cancelled
        // caller may leave failed on the server.
        self.touched = true;
        self.unchecked = true;
        let now = self.store.config.clock.now_ms();
        let rows = on_tx!(&mut self.inner, t => t.read(sql, now).await);
        if rows.is_err() {
            on_tx!(&mut self.inner, t => t.mark_written());
        }
        rows
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
        Conn(
            on_tx!(&mut self.inner, t => t.conn()),
            &self.store.config.clock,
        )
    }

    /// The name of its driver, `"sqlite"` or `"postgres"` (without taking its
    /// connection, as [`conn`](Self::conn) does).
    pub fn backend(&self) -> &'static str {
        on_tx_driver!(self.inner, D => D::NAME)
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
        self.touched = true;
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
            return on_tx_driver!(self.inner, D => D::enqueue_handing(self, &store, &to, messages).await);
        }
        store.enqueue_batch(self.conn_marked(), messages).await?;
        self.enqueued = true;
        Ok(())
    }

    /// Enqueues in order, writing each message that `to` takes leased to it (handed
    /// over when this transaction commits), the others `pending`, in runs.
    pub(crate) async fn enqueue_handing(
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
            let leased_at = self.store.clock().lease_now();
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
        on_tx!(&mut self.inner, t => t.execute(sql).await)
    }

    pub(crate) fn mark_enqueued(&mut self) {
        self.enqueued = true;
    }

    /// Commits, then wakes the relays if anything was enqueued.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) if the commit fails; nothing was
    /// written then.
    pub async fn commit(self) -> Result<()> {
        on_tx_driver!(self.inner, D => D::commit(self).await)
    }

    /// After a commit: the driver told (SQLite's checkpointer), the rows written leased handed
    /// over, the relays woken if anything was enqueued.
    pub(crate) fn after_commit(
        store: &Store,
        handed: &mut super::handover::Handed,
        enqueued: bool,
    ) {
        on_backend!(store.backend_ref(), b => b.committed());
        handed.commit();
        if enqueued {
            store.wake();
        }
    }

    /// Rolls back: nothing enqueued in it ever existed.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error.
    pub async fn rollback(self) -> Result<()> {
        on_tx_driver!(self.inner, D => D::rollback(self).await)
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

    /// The one match on the driver of a write: each driver runs it its way.
    async fn write_as(&mut self, writes: Writes, last: bool) -> Result<()> {
        writes.check()?;
        self.touched = true;
        on_tx_driver!(self.inner, D => D::write(self, writes, last).await)
    }
}

/// Whether `text` reads only: it begins with `SELECT` or `WITH` and names no write
/// (`INSERT`, `UPDATE`, `DELETE`, `MERGE`) and no row lock (`FOR UPDATE`, `FOR SHARE`,
/// `FOR NO KEY UPDATE`, `FOR KEY SHARE`), as a word anywhere, string literals
/// included (a literal that holds one is refused too: never the other way round).
pub(crate) fn is_a_read(text: &str) -> bool {
    let upper = text.to_ascii_uppercase();
    let mut words = upper
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty());
    matches!(words.next(), Some("SELECT" | "WITH"))
        && !words.any(|w| matches!(w, "INSERT" | "UPDATE" | "DELETE" | "MERGE" | "SHARE"))
}
