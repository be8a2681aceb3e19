//! Connections and transactions of either backend.

use sqlx::Transaction;
#[cfg(feature = "postgres")]
use sqlx::{PgConnection, Postgres};
#[cfg(feature = "sqlite")]
use sqlx::{Sqlite, SqliteConnection};

use super::backend::Backend;
use super::{Receipt, Store};
use crate::{Message, MessageId, Result};

/// A borrowed connection of either backend, usually the inside of a transaction.
/// `&mut *tx` of a `sqlx::Transaction` converts into it, so the outbox joins the
/// caller's own transaction.
#[derive(Debug)]
pub enum Conn<'a> {
    /// A SQLite connection.
    #[cfg(feature = "sqlite")]
    Sqlite(&'a mut SqliteConnection),
    /// A PostgreSQL connection.
    #[cfg(feature = "postgres")]
    Postgres(&'a mut PgConnection),
}

impl Conn<'_> {
    /// `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        match self {
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(_) => "sqlite",
            #[cfg(feature = "postgres")]
            Conn::Postgres(_) => "postgres",
        }
    }
}

#[cfg(feature = "sqlite")]
impl<'a> From<&'a mut SqliteConnection> for Conn<'a> {
    fn from(c: &'a mut SqliteConnection) -> Self {
        Conn::Sqlite(c)
    }
}

#[cfg(feature = "postgres")]
impl<'a> From<&'a mut PgConnection> for Conn<'a> {
    fn from(c: &'a mut PgConnection) -> Self {
        Conn::Postgres(c)
    }
}

#[derive(Debug)]
enum Inner {
    #[cfg(feature = "sqlite")]
    Sqlite(Transaction<'static, Sqlite>),
    /// SQLite's lane: the writer connection, its transactions begun and ended by hand
    /// (statements run on it directly), kept by the lane from one batch to the next.
    #[cfg(feature = "sqlite")]
    Lane(LaneConn),
    #[cfg(feature = "postgres")]
    Postgres(Transaction<'static, Postgres>),
}

/// The writer connection of SQLite's lane.
#[cfg(feature = "sqlite")]
#[derive(Debug)]
struct LaneConn {
    conn: sqlx::pool::PoolConnection<Sqlite>,
    /// A transaction is open on it, or may be (one that failed to end). sqlx knows
    /// nothing of it: dropped so, the connection is closed instead of going back to
    /// the pool, and closing rolls the transaction back.
    open: bool,
}

#[cfg(feature = "sqlite")]
impl Drop for LaneConn {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

/// A write transaction of the store. Dropping it without committing rolls it back.
#[derive(Debug)]
#[must_use = "a transaction that is not committed is rolled back"]
pub struct Tx {
    /// SQLite's lane: the connection locked away from sqlx's thread while the lane's
    /// statements run on it directly (see [`direct`](super::direct)). Declared before
    /// `inner`, whose connection it borrows: dropped first.
    #[cfg(feature = "sqlite")]
    direct: Option<super::direct::Session>,
    inner: Inner,
    store: Store,
    enqueued: bool,
    handed: super::handover::Handed,
    /// The next [`enqueue_batch_after`](Self::enqueue_batch_after) may be deferred.
    defer: bool,
    /// A deferred last write, run by the lane in the round trip that ends the hop.
    #[cfg(feature = "sqlite")]
    tail: Option<super::sqlite::Tail>,
    /// PostgreSQL's set lane: what its hops keep as data, written at the batch's end.
    #[cfg(feature = "postgres")]
    sets: Option<super::sets::Kept>,
    /// A statement may have failed in this transaction unseen by the store: the
    /// connection was lent out ([`conn`](Self::conn)) or a statement of the store's
    /// failed (its error may have been swallowed). On PostgreSQL such a transaction is
    /// aborted, and its `COMMIT` is answered `ROLLBACK`, which sqlx reports as success:
    /// the commit probes first.
    unchecked: bool,
}

impl Tx {
    pub(super) async fn begin(store: &Store) -> Result<Self> {
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
    fn new(store: &Store, inner: Inner) -> Self {
        Self {
            #[cfg(feature = "sqlite")]
            direct: None,
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
    fn in_lane(&self) -> bool {
        #[cfg(feature = "sqlite")]
        {
            self.is_lane()
        }
        #[cfg(not(feature = "sqlite"))]
        {
            false
        }
    }

    /// Lets the next [`enqueue_batch_after`](Self::enqueue_batch_after) of this hop be
    /// run in the round trip that ends the hop (on SQLite, in the lane's shared
    /// transaction, with the release of its savepoint and the opening of the next hop),
    /// instead of a round trip of its own. Its errors then come from
    /// [`Hop::commit`](super::Hop::commit), and the hop is undone. Call it only when
    /// that write is the hop's last statement. Elsewhere (PostgreSQL, a transaction
    /// from [`Store::begin`]) it changes nothing.
    pub fn defer_next_write(&mut self) {
        self.defer = self.in_lane();
        #[cfg(feature = "postgres")]
        if let Some(kept) = &mut self.sets {
            kept.deferrable = true;
        }
    }

    /// In a hop of PostgreSQL's set lane after
    /// [`defer_next_write`](Self::defer_next_write): `true`, and the caller then
    /// hands its last write over as data ([`defer_rows`](Self::defer_rows),
    /// [`defer_enqueue`](Self::defer_enqueue)), written with the batch's. Elsewhere
    /// `false`: write it as usual. Either way the permission is used up.
    pub fn take_set_deferral(&mut self) -> bool {
        #[cfg(feature = "postgres")]
        if let Some(kept) = &mut self.sets {
            return std::mem::take(&mut kept.deferrable);
        }
        false
    }

    /// Keeps `row` of `statement`, written with the rows of the batch's other hops in
    /// one statement when the set lane's batch ends (see
    /// [`take_set_deferral`](Self::take_set_deferral)). Later statements of this hop
    /// do not see it.
    ///
    /// # Errors
    /// [`Error::BackendMismatch`](crate::Error::BackendMismatch) outside a hop of the
    /// set lane.
    #[cfg(feature = "postgres")]
    pub fn defer_rows(
        &mut self,
        statement: &'static super::sets::SetStatement,
        row: Vec<super::sets::SetValue>,
    ) -> Result<()> {
        match &mut self.sets {
            Some(kept) => {
                kept.push_row(statement, row);
                Ok(())
            }
            None => Err(crate::Error::BackendMismatch {
                store: "postgres (set lane)",
                connection: self.backend(),
            }),
        }
    }

    /// Keeps `messages`, enqueued with the batch's other messages when the set lane's
    /// batch ends (handed over directly where they can be), as
    /// [`defer_rows`](Self::defer_rows) keeps rows.
    ///
    /// # Errors
    /// As [`Store::enqueue`](crate::Store::enqueue) for bad input (nothing kept);
    /// [`Error::BackendMismatch`](crate::Error::BackendMismatch) outside a hop of the
    /// set lane.
    pub fn defer_enqueue(&mut self, messages: &[Message]) -> Result<()> {
        for m in messages {
            self.store.validate(m)?;
        }
        #[cfg(feature = "postgres")]
        if let Some(kept) = &mut self.sets {
            // Their trace context is the caller's, taken now (the batch writes them
            // later, in the lane's task).
            let span = super::enqueue_span(messages, false);
            let stamped: Vec<Message> = span.in_scope(|| {
                messages
                    .iter()
                    .map(|m| {
                        let mut m = m.clone();
                        if let Some(headers) = crate::propagation::outgoing(&m.headers) {
                            m.headers = headers;
                        }
                        m
                    })
                    .collect()
            });
            kept.push_messages(stamped);
            return Ok(());
        }
        Err(crate::Error::BackendMismatch {
            store: "postgres (set lane)",
            connection: self.backend(),
        })
    }

    /// This transaction becomes the set lane's: its hops may keep their writes.
    #[cfg(feature = "postgres")]
    pub(super) fn start_sets(&mut self) {
        self.sets = Some(super::sets::Kept::default());
    }

    #[cfg(feature = "postgres")]
    pub(super) fn kept_mut(&mut self) -> Option<&mut super::sets::Kept> {
        self.sets.as_mut()
    }

    #[cfg(feature = "postgres")]
    pub(super) fn take_kept(&mut self) -> Option<super::sets::Kept> {
        self.sets.take()
    }

    /// A row written leased, handed over when this transaction commits.
    #[cfg(feature = "postgres")]
    pub(super) fn push_handed(
        &mut self,
        to: std::sync::Arc<dyn super::Handover>,
        row: crate::Envelope,
    ) {
        self.handed.push(to, row);
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
    fn conn_marked(&mut self) -> Conn<'_> {
        #[cfg(feature = "postgres")]
        if let Some(kept) = &mut self.sets {
            kept.dirty = true;
        }
        self.conn_clean()
    }

    /// A statement of the store's failed in this transaction: its caller may swallow
    /// the error and commit, so the commit must probe.
    fn suspect<T>(&mut self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.unchecked = true;
        }
        r
    }

    /// The set lane checked the transaction itself (see `sets.rs`): no probe needed.
    #[cfg(feature = "postgres")]
    pub(super) fn checked(&mut self) {
        self.unchecked = false;
    }

    /// The connection, for the store's own statements (not the caller's: a hop of
    /// the set lane stays clean).
    pub(super) fn conn_clean(&mut self) -> Conn<'_> {
        #[cfg(feature = "sqlite")]
        {
            debug_assert!(
                self.tail.is_none(),
                "a statement after a hop's deferred last write"
            );
            // sqlx's thread runs what comes next: give the connection back to it.
            self.direct = None;
        }
        match &mut self.inner {
            #[cfg(feature = "sqlite")]
            Inner::Sqlite(tx) => Conn::Sqlite(&mut *tx),
            #[cfg(feature = "sqlite")]
            Inner::Lane(lane) => Conn::Sqlite(&mut lane.conn),
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
                let span = super::enqueue_span(messages, true);
                let write = self.write_messages(&store, messages.to_vec());
                return tracing::Instrument::instrument(write, span).await;
            }
            return self.enqueue_handing(&store, &to, messages).await;
        }
        store.enqueue_batch(self.conn_marked(), messages).await?;
        self.enqueued = true;
        Ok(())
    }

    /// Runs `before` (`before_statements` statements of the caller's, built on SQLite),
    /// then enqueues `messages` as [`enqueue_batch`](Self::enqueue_batch) does (direct
    /// handover included), all in one round trip: one hand-off to the connection's
    /// thread instead of one for the caller's statements and one for each message
    /// written leased. After [`defer_next_write`](Self::defer_next_write), in a hop of
    /// SQLite's lane, that round trip is the one that ends the hop. With a
    /// [`max_pending`](crate::StoreConfig::max_pending) limit, whose count must come
    /// first, they are two round trips. Rows the statements of `before` return are
    /// dropped.
    ///
    /// # Errors
    /// [`Error::BackendMismatch`](crate::Error::BackendMismatch) on a PostgreSQL
    /// transaction; as [`enqueue_batch`](Self::enqueue_batch); the database's error of
    /// a statement of `before` (roll the transaction back: some statements may have
    /// run).
    #[cfg(feature = "sqlite")]
    #[allow(irrefutable_let_patterns)] // a SQLite-only build has no other connection
    pub async fn enqueue_batch_after(
        &mut self,
        before: super::direct::Statements,
        messages: &[Message],
    ) -> Result<()> {
        let store = self.store.clone();
        let defer = std::mem::take(&mut self.defer);
        #[allow(unreachable_patterns)] // a SQLite-only build has no other transaction
        if self.backend() != "sqlite" {
            return Err(crate::Error::BackendMismatch {
                store: store.backend(),
                connection: "postgres",
            });
        }
        // An earlier deferred write goes first.
        self.flush_tail().await?;
        if store.config().max_pending.is_some() {
            if let Conn::Sqlite(c) = self.conn() {
                sqlx::Executor::execute(&mut *c, before.to_sqlx().build()).await?;
            }
            return self.enqueue_batch(messages).await;
        }
        for m in messages {
            store.validate(m)?;
        }
        let to = store.handover();
        let leased: Vec<bool> = messages
            .iter()
            .map(|m| {
                to.as_ref()
                    .is_some_and(|to| m.delay.is_zero() && to.reserve(&m.destination))
            })
            .collect();
        // The messages' headers carry the enqueue span's context: built in it.
        let span = super::enqueue_span(messages, leased.contains(&true));
        let mut tail = span.in_scope(|| super::sqlite::Tail::new(before, messages, &leased, to))?;
        if defer {
            self.tail = Some(tail);
            return Ok(());
        }
        let run = self.open_sqlite(Some(&mut tail), "", 0, None, None);
        let opened = tracing::Instrument::instrument(run, span).await;
        let opened = opened.map_err(|failed| failed.error)?;
        self.settle(tail, opened.tail_rows)
    }

    /// Takes what a tail wrote: its leased rows to hand over on commit, a wake-up for
    /// its pending ones.
    #[cfg(feature = "sqlite")]
    fn settle(
        &mut self,
        tail: super::sqlite::Tail,
        rows: Vec<(usize, super::direct::Row)>,
    ) -> Result<()> {
        let settled = tail.settle(rows)?;
        if let Some(to) = settled.to {
            for row in settled.handed {
                self.handed.push(std::sync::Arc::clone(&to), row);
            }
        }
        self.enqueued |= settled.pending;
        Ok(())
    }

    /// Drops a deferred last write (its hop is undone): its handover slots are given
    /// back.
    pub(super) fn drop_tail(&mut self) {
        #[cfg(feature = "sqlite")]
        {
            self.tail = None;
        }
    }

    /// Runs a deferred last write now, in a round trip of its own.
    ///
    /// # Errors
    /// The database's; the hop that deferred it must then be undone.
    pub(super) async fn flush_tail(&mut self) -> Result<()> {
        #[cfg(feature = "sqlite")]
        if self.tail.is_some() {
            self.open_hop("", 0, None, None).await.map_err(|(_, e)| e)?;
        }
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
            match store
                .enqueue_leased(self.conn_marked(), m, to.as_ref())
                .await
            {
                Ok(Some(row)) => self.handed.push(std::sync::Arc::clone(to), row),
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
    pub(super) fn handed_mark(&self) -> usize {
        self.handed.mark()
    }

    /// The savepoint of `mark` was rolled back: its rows are not handed over.
    pub(super) fn cancel_handed_since(&mut self, mark: usize) {
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
    pub(super) async fn savepoint_op(&mut self, sql: &'static str) -> Result<()> {
        self.execute(sql).await
    }

    /// Opens a hop in this (shared) transaction: runs `prefix`, `statements` savepoint
    /// statements each ending in `;`, then records `inbox` (if given) in the inbox, then
    /// runs `prefetch` (if given), in one round trip on SQLite. On an error, also how
    /// many statements of the prefix completed before it.
    pub(super) async fn open_hop(
        &mut self,
        prefix: &'static str,
        statements: usize,
        inbox: Option<(&str, MessageId)>,
        prefetch: Option<&super::Prefetch>,
    ) -> std::result::Result<(Option<Receipt>, Option<super::Prefetched>), (usize, crate::Error)>
    {
        #[cfg(feature = "sqlite")]
        let (recorded, read) = if self.backend() == "sqlite" {
            let mut tail = self.tail.take();
            let opened = self
                .open_sqlite(tail.as_mut(), prefix, statements, inbox, prefetch)
                .await;
            let opened = match opened {
                Ok(opened) => opened,
                Err(failed) => {
                    // The prefix ran whole: the failure is the next hop's (its inbox
                    // record or read), and the ended hop, its tail included, is kept.
                    // Otherwise the ended hop is undone, its tail dropped.
                    if failed.prefix_done == statements
                        && let Some(tail) = tail
                    {
                        self.settle(tail, failed.tail_rows).map_err(|e| (0, e))?;
                    }
                    return Err((failed.prefix_done, failed.error));
                }
            };
            if let Some(tail) = tail {
                // The tail's statements are the first of the round trip: a failure of
                // its own settling is the ended hop's (none of the prefix).
                self.settle(tail, opened.tail_rows).map_err(|e| (0, e))?;
            }
            (opened.recorded, opened.read)
        } else {
            self.open_postgres(prefix, statements, inbox).await?
        };
        #[cfg(not(feature = "sqlite"))]
        let (recorded, read) = {
            let _ = prefetch; // a SQLite read: PostgreSQL hops read for themselves
            self.open_postgres(prefix, statements, inbox).await?
        };
        let receipt = recorded.map(|first| {
            if first {
                Receipt::First
            } else {
                Receipt::Duplicate
            }
        });
        Ok((receipt, read))
    }

    /// Opens a hop on PostgreSQL. Not used by the lanes (PostgreSQL hops have
    /// transactions of their own); correct all the same, one statement at a time.
    #[allow(irrefutable_let_patterns, clippy::type_complexity)]
    async fn open_postgres(
        &mut self,
        prefix: &'static str,
        statements: usize,
        inbox: Option<(&str, MessageId)>,
    ) -> std::result::Result<(Option<bool>, Option<super::Prefetched>), (usize, crate::Error)> {
        #[cfg(feature = "postgres")]
        if let Conn::Postgres(c) = self.conn() {
            use sqlx::Executor;
            let mut done = 0;
            for sql in prefix.split(';').map(str::trim).filter(|s| !s.is_empty()) {
                c.execute(sql).await.map_err(|e| (done, e.into()))?;
                done += 1;
            }
            debug_assert_eq!(done, statements, "the prefix's statement count");
            let recorded = match inbox {
                None => None,
                Some((consumer, id)) => Some(
                    <super::postgres::Postgres as super::backend::Dialect>::receive(
                        c, consumer, id,
                    )
                    .await
                    .map_err(|e| (done, e))?,
                ),
            };
            return Ok((recorded, None));
        }
        let _ = (prefix, statements, inbox);
        Err((
            0,
            crate::Error::BackendMismatch {
                store: self.store.backend(),
                connection: "sqlite",
            },
        ))
    }

    /// On the lane's connection (SQLite), marks `delivered` and claims as
    /// [`Queue::ack_and_claim`](super::queue::Queue::ack_and_claim), with statements
    /// run directly; `None` for another transaction.
    #[cfg(feature = "sqlite")]
    pub(super) async fn lane_ack_and_claim(
        &mut self,
        delivered: &[i64],
        claim: &super::queue::Claim<'_>,
    ) -> Option<Result<(u64, Vec<crate::Envelope>)>> {
        if !self.is_lane() {
            return None;
        }
        Some(
            self.session()
                .await
                .and_then(|s| super::sqlite::Sqlite::ack_and_claim_direct(s, delivered, claim)),
        )
    }

    /// A transaction of SQLite's lane, begun by [`begin_lane`](Self::begin_lane).
    #[cfg(feature = "sqlite")]
    pub(super) fn is_lane(&self) -> bool {
        matches!(self.inner, Inner::Lane(_))
    }

    /// The SQLite connection, without giving it back to sqlx's thread.
    #[cfg(feature = "sqlite")]
    fn sqlite_conn(&mut self) -> Option<&mut SqliteConnection> {
        match &mut self.inner {
            Inner::Sqlite(tx) => Some(tx),
            Inner::Lane(lane) => Some(&mut lane.conn),
            #[cfg(feature = "postgres")]
            Inner::Postgres(_) => None,
        }
    }

    /// The connection locked for statements run directly, locked now if need be.
    #[cfg(feature = "sqlite")]
    #[allow(unsafe_code)] // the one call that locks a session (see `direct`)
    async fn session(&mut self) -> Result<&mut super::direct::Session> {
        let session = match self.direct.take() {
            Some(session) => session,
            None => {
                let Some(c) = self.sqlite_conn() else {
                    return Err(crate::Error::BackendMismatch {
                        store: "sqlite",
                        connection: "postgres",
                    });
                };
                // SAFETY: the session is kept in `self.direct`, declared before
                // `self.inner` (dropped first), taken before the transaction commits or
                // rolls back through sqlx, and dropped by `conn()` before sqlx uses the
                // connection.
                unsafe { super::direct::Session::lock(c).await }?
            }
        };
        Ok(self.direct.insert(session))
    }

    /// Begins the lane's shared transaction (SQLite): on `spare`, the connection the
    /// lane kept from its last one, or on the writer taken from the pool.
    #[cfg(feature = "sqlite")]
    pub(super) async fn begin_lane(store: &Store, spare: Option<Tx>) -> Result<Tx> {
        let mut t = match spare {
            Some(t) => t,
            None => {
                #[allow(irrefutable_let_patterns)] // a SQLite-only build has no other backend
                let Backend::Sqlite(db) = store.backend_ref() else {
                    // No lane on PostgreSQL: a transaction of its own.
                    return Self::begin(store).await;
                };
                let conn = db.writer.acquire().await?;
                Self::new(store, Inner::Lane(LaneConn { conn, open: false }))
            }
        };
        if let Inner::Lane(lane) = &mut t.inner {
            lane.open = true;
        }
        t.lane_statement("BEGIN IMMEDIATE").await?;
        Ok(t)
    }

    /// Runs `BEGIN IMMEDIATE`, `COMMIT` or `ROLLBACK` on the lane's connection:
    /// directly, except a `BEGIN` that would wait for another process's write and a
    /// `COMMIT` that syncs to disk (`synchronous = FULL`), which sqlx's thread waits
    /// for instead of a tokio worker.
    #[cfg(feature = "sqlite")]
    async fn lane_statement(&mut self, sql: &'static str) -> Result<()> {
        let begin = sql.starts_with("BEGIN");
        let syncs = sql == "COMMIT" && self.store.config().synchronous == super::Synchronous::Full;
        if !syncs {
            let busy_timeout = self.store.config().busy_timeout;
            let session = self.session().await?;
            if begin {
                session.busy_timeout(std::time::Duration::ZERO);
            }
            let ran = session.run(&super::direct::Statement::plain(sql), |_| {});
            if begin {
                session.busy_timeout(busy_timeout);
            }
            match ran {
                Err(e) if begin && super::sqlite::is_busy(&e) => {}
                ran => return ran,
            }
        }
        self.direct = None;
        let Some(c) = self.sqlite_conn() else {
            return Ok(());
        };
        sqlx::Executor::execute(c, sql).await?;
        Ok(())
    }

    /// Ends the lane's transaction, keeping the connection for the next: commits
    /// (then hands over and wakes as [`commit`](Self::commit)) or rolls back. After an
    /// error the transaction may still be open: drop the `Tx` (its connection is
    /// closed, which rolls back).
    #[cfg(feature = "sqlite")]
    pub(super) async fn end_lane(&mut self, commit: bool) -> Result<()> {
        self.tail = None;
        self.defer = false;
        if commit {
            self.lane_statement("COMMIT").await?;
            Self::after_commit(&self.store, &mut self.handed, self.enqueued);
        } else {
            self.lane_statement("ROLLBACK").await?;
            self.handed.cancel_since(0);
        }
        self.enqueued = false;
        if let Inner::Lane(lane) = &mut self.inner {
            lane.open = false;
        }
        Ok(())
    }

    /// Runs a hop's opening round trip on SQLite (see [`super::sqlite::Sqlite::open_hop`]):
    /// in the lane on the connection directly, elsewhere through sqlx.
    #[cfg(feature = "sqlite")]
    #[allow(unsafe_code)] // the one call that locks a session (see `direct`)
    async fn open_sqlite(
        &mut self,
        tail: Option<&mut super::sqlite::Tail>,
        prefix: &'static str,
        statements: usize,
        inbox: Option<(&str, MessageId)>,
        prefetch: Option<&super::Prefetch>,
    ) -> std::result::Result<super::sqlite::Opened, super::sqlite::OpenFailed> {
        let failed = |error| super::sqlite::OpenFailed {
            prefix_done: 0,
            error,
            tail_rows: Vec::new(),
        };
        if !self.in_lane() {
            let Some(c) = self.sqlite_conn() else {
                return Err(failed(crate::Error::BackendMismatch {
                    store: "sqlite",
                    connection: "postgres",
                }));
            };
            return super::sqlite::Sqlite::open_hop(c, tail, prefix, statements, inbox, prefetch)
                .await;
        }
        let session = self.session().await.map_err(failed)?;
        super::sqlite::Sqlite::open_hop_direct(session, tail, prefix, statements, inbox, prefetch)
    }

    async fn execute(&mut self, sql: &'static str) -> Result<()> {
        use sqlx::Executor;
        #[cfg(feature = "sqlite")]
        if let Some(session) = &mut self.direct {
            // The lane's savepoints, while it holds the connection.
            return session.run(&super::direct::Statement::plain(sql), |_| {});
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

    pub(super) fn mark_enqueued(&mut self) {
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
        #[cfg(feature = "sqlite")]
        drop(self.direct.take());
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
    fn after_commit(store: &Store, handed: &mut super::handover::Handed, enqueued: bool) {
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
        #[cfg(feature = "sqlite")]
        drop(self.direct.take());
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

// The exported macros below exist in one version per set of compiled backends, so that
// the arms they expand to are chosen by this crate's features, not by the caller's: a
// crate above (the saga engine, your code) names both backends and gets the ones built.

/// Matches a [`Conn`] with one arm per backend, keeping only the arms of the backends
/// this build has: `match_conn!(conn, sqlite(c) => …, postgres(c) => …)`. The arm of
/// a backend left out is never compiled, so it may name that backend's types.
#[cfg(all(feature = "sqlite", feature = "postgres"))]
#[macro_export]
macro_rules! match_conn {
    ($conn:expr, sqlite($s:ident) => $sb:expr, postgres($p:ident) => $pb:expr $(,)?) => {
        match $conn {
            $crate::Conn::Sqlite($s) => $sb,
            $crate::Conn::Postgres($p) => $pb,
        }
    };
}

/// Matches a [`Conn`] with one arm per backend (this build: SQLite only).
#[cfg(all(feature = "sqlite", not(feature = "postgres")))]
#[macro_export]
macro_rules! match_conn {
    ($conn:expr, sqlite($s:ident) => $sb:expr, postgres($p:ident) => $pb:expr $(,)?) => {
        match $conn {
            $crate::Conn::Sqlite($s) => $sb,
        }
    };
}

/// Matches a [`Conn`] with one arm per backend (this build: PostgreSQL only).
#[cfg(all(not(feature = "sqlite"), feature = "postgres"))]
#[macro_export]
macro_rules! match_conn {
    ($conn:expr, sqlite($s:ident) => $sb:expr, postgres($p:ident) => $pb:expr $(,)?) => {
        match $conn {
            $crate::Conn::Postgres($p) => $pb,
        }
    };
}

/// Matches a [`ReadPool`](crate::ReadPool) with one arm per backend, as
/// [`match_conn!`](crate::match_conn) does for a [`Conn`].
#[cfg(all(feature = "sqlite", feature = "postgres"))]
#[macro_export]
macro_rules! match_reader {
    ($pool:expr, sqlite($s:ident) => $sb:expr, postgres($p:ident) => $pb:expr $(,)?) => {
        match $pool {
            $crate::ReadPool::Sqlite($s) => $sb,
            $crate::ReadPool::Postgres($p) => $pb,
        }
    };
}

/// Matches a [`ReadPool`](crate::ReadPool) (this build: SQLite only).
#[cfg(all(feature = "sqlite", not(feature = "postgres")))]
#[macro_export]
macro_rules! match_reader {
    ($pool:expr, sqlite($s:ident) => $sb:expr, postgres($p:ident) => $pb:expr $(,)?) => {
        match $pool {
            $crate::ReadPool::Sqlite($s) => $sb,
        }
    };
}

/// Matches a [`ReadPool`](crate::ReadPool) (this build: PostgreSQL only).
#[cfg(all(not(feature = "sqlite"), feature = "postgres"))]
#[macro_export]
macro_rules! match_reader {
    ($pool:expr, sqlite($s:ident) => $sb:expr, postgres($p:ident) => $pb:expr $(,)?) => {
        match $pool {
            $crate::ReadPool::Postgres($p) => $pb,
        }
    };
}

/// Keeps its items only in a build with the SQLite backend (the code of a crate above
/// that names SQLite's types).
#[cfg(feature = "sqlite")]
#[macro_export]
macro_rules! if_sqlite {
    ($($item:item)*) => { $($item)* };
}

/// Keeps its items only in a build with the SQLite backend (this build has none).
#[cfg(not(feature = "sqlite"))]
#[macro_export]
macro_rules! if_sqlite {
    ($($item:item)*) => {};
}

/// Keeps its items only in a build with the PostgreSQL backend.
#[cfg(feature = "postgres")]
#[macro_export]
macro_rules! if_postgres {
    ($($item:item)*) => { $($item)* };
}

/// Keeps its items only in a build with the PostgreSQL backend (this build has none).
#[cfg(not(feature = "postgres"))]
#[macro_export]
macro_rules! if_postgres {
    ($($item:item)*) => {};
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
        $crate::match_conn!($conn, sqlite($c) => $body, postgres($c) => $body)
    };
}

/// Runs the same code on a [`ReadPool`](crate::ReadPool) of either backend: `$p` is the
/// backend's pool in each arm. See [`with_conn!`](crate::with_conn).
#[macro_export]
macro_rules! with_reader {
    ($pool:expr, $p:ident => $body:expr) => {
        $crate::match_reader!($pool, sqlite($p) => $body, postgres($p) => $body)
    };
}

/// An `integer` column of either backend, as an `i64`: SQLite stores 64 bits,
/// PostgreSQL's `integer` 32. For decoding a row the same way on both
/// (`row.try_get::<Integer, _>("attempts")?.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Integer(pub i64);

#[cfg(feature = "sqlite")]
impl sqlx::Type<sqlx::Sqlite> for Integer {
    fn type_info() -> sqlx::sqlite::SqliteTypeInfo {
        <i64 as sqlx::Type<sqlx::Sqlite>>::type_info()
    }
}

#[cfg(feature = "sqlite")]
impl<'r> sqlx::Decode<'r, sqlx::Sqlite> for Integer {
    fn decode(
        value: sqlx::sqlite::SqliteValueRef<'r>,
    ) -> std::result::Result<Self, sqlx::error::BoxDynError> {
        <i64 as sqlx::Decode<sqlx::Sqlite>>::decode(value).map(Integer)
    }
}

#[cfg(feature = "postgres")]
impl sqlx::Type<sqlx::Postgres> for Integer {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <i32 as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

#[cfg(feature = "postgres")]
impl<'r> sqlx::Decode<'r, sqlx::Postgres> for Integer {
    fn decode(
        value: sqlx::postgres::PgValueRef<'r>,
    ) -> std::result::Result<Self, sqlx::error::BoxDynError> {
        <i32 as sqlx::Decode<sqlx::Postgres>>::decode(value).map(|n| Integer(i64::from(n)))
    }
}
