//! SQLite's side of a [`Tx`]: the lane's transaction (begun and ended by hand on the
//! writer it keeps), its session that runs statements on the connection directly, a
//! hop's opening round trip and its deferred last write (its tail).

use sqlx::SqliteConnection;

pub(crate) use super::direct::LaneConn;

use tokio::sync::oneshot;

use super::held::{Held, SqliteTx};
use crate::Error;
use crate::drivers::{Backend, TxOf};
use crate::store::{Receipt, Store, Tx};
use crate::{Message, MessageId, Result};

impl SqliteTx {
    pub(crate) fn of(held: Held) -> TxOf {
        TxOf::Sqlite(Self { held, tail: None })
    }
}

impl Tx {
    /// SQLite's side of this transaction (`None` for another driver's).
    #[allow(irrefutable_let_patterns, clippy::unnecessary_wraps)] // a SQLite-only build has no other
    pub(crate) fn lite(&mut self) -> Option<&mut SqliteTx> {
        if let TxOf::Sqlite(t) = &mut self.inner {
            Some(t)
        } else {
            None
        }
    }

    pub(crate) fn lite_ref(&self) -> Option<&SqliteTx> {
        #[allow(irrefutable_let_patterns)]
        if let TxOf::Sqlite(t) = &self.inner {
            Some(t)
        } else {
            None
        }
    }
}

impl Tx {
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
    #[allow(irrefutable_let_patterns)] // a SQLite-only build has no other connection
    #[cfg(test)]
    pub(crate) async fn enqueue_batch_after(
        &mut self,
        before: crate::drivers::sqlite::statements::Statements,
        messages: &[Message],
    ) -> Result<()> {
        self.statements_then_messages(before, messages, true).await
    }

    /// [`enqueue_batch_after`](Self::enqueue_batch_after), deferred only if `may_defer`
    /// (the hop's last write) and the hop allowed it.
    #[allow(irrefutable_let_patterns)] // a SQLite-only build has no other connection
    pub(crate) async fn statements_then_messages(
        &mut self,
        before: crate::drivers::sqlite::statements::Statements,
        messages: &[Message],
        may_defer: bool,
    ) -> Result<()> {
        let store = self.store.clone();
        let defer = may_defer && std::mem::take(&mut self.defer);
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
            if let Some(c) = self.conn().into_sqlite() {
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
        let span = crate::propagation::enqueue_span(messages, leased.contains(&true));
        let clock = self.store.clock();
        let mut tail = span.in_scope(|| {
            crate::drivers::sqlite::tail::Tail::new(before, messages, &leased, to, clock)
        })?;
        if defer && let Some(t) = self.lite() {
            t.tail = Some(tail);
            return Ok(());
        }
        let run = self.open_sqlite(Some(&mut tail), "", 0, None, None);
        let opened = tracing::Instrument::instrument(run, span).await;
        let opened = opened.map_err(|failed| failed.error)?;
        self.take_tail(tail, opened.tail_rows)
    }

    /// Takes what a tail wrote: its leased rows to hand over on commit, a wake-up for
    /// its pending ones.
    fn take_tail(
        &mut self,
        tail: crate::drivers::sqlite::tail::Tail,
        rows: Vec<(usize, crate::drivers::sqlite::statements::Row)>,
    ) -> Result<()> {
        let written = tail.written(rows)?;
        if let Some(to) = written.to {
            for row in written.handed {
                self.handed
                    .push(std::sync::Arc::clone(&to), row, written.leased_at);
            }
        }
        self.enqueued |= written.pending;
        Ok(())
    }

    /// Drops a deferred last write (its hop is undone): its handover slots are given
    /// back.
    pub(crate) fn drop_tail(&mut self) {
        if let Some(t) = self.lite() {
            t.tail = None;
        }
    }

    /// Runs a deferred last write now, in a round trip of its own.
    ///
    /// # Errors
    /// The database's; the hop that deferred it must then be undone.
    pub(crate) async fn flush_tail(&mut self) -> Result<()> {
        if self.lite_ref().is_some_and(|t| t.tail.is_some()) {
            self.open_hop("", 0, None, None).await.map_err(|(_, e)| e)?;
        }
        Ok(())
    }

    /// Opens a hop in this (shared) transaction: runs `prefix`, `statements` savepoint
    /// statements each ending in `;`, then records `inbox` (if given) in the inbox, then
    /// runs `prefetch` (if given), in one round trip on SQLite. On an error, also how
    /// many statements of the prefix completed before it.
    pub(crate) async fn open_hop(
        &mut self,
        prefix: &'static str,
        statements: usize,
        inbox: Option<(&str, MessageId)>,
        prefetch: Option<&crate::store::prefetch::Prefetch>,
    ) -> std::result::Result<
        (Option<Receipt>, Option<crate::store::prefetch::Prefetched>),
        (usize, crate::Error),
    > {
        let mut tail = self.lite().and_then(|t| t.tail.take());
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
                    self.take_tail(tail, failed.tail_rows).map_err(|e| (0, e))?;
                }
                return Err((failed.prefix_done, failed.error));
            }
        };
        if let Some(tail) = tail {
            // The tail's statements are the first of the round trip: a failure of
            // its own settling is the ended hop's (none of the prefix).
            self.take_tail(tail, opened.tail_rows).map_err(|e| (0, e))?;
        }
        let (recorded, read) = (opened.recorded, opened.read);
        let receipt = recorded.map(|first| {
            if first {
                Receipt::First
            } else {
                Receipt::Duplicate
            }
        });
        Ok((receipt, read))
    }

    /// On the lane's connection (SQLite), marks `delivered` and claims as
    /// [`Queue::ack_and_claim`](crate::store::queue::Queue::ack_and_claim), with statements
    /// run directly; `None` for another transaction.
    pub(crate) async fn lane_ack_and_claim(
        &mut self,
        delivered: &[i64],
        claim: &crate::store::queue_types::Claim<'_>,
    ) -> Option<Result<(u64, Vec<crate::Envelope>)>> {
        if !self.is_lane() {
            return None;
        }
        let at = crate::drivers::sqlite::ClaimTimes::of(self.store().clock());
        Some(self.session().await.and_then(|s| {
            crate::drivers::sqlite::Sqlite::ack_and_claim_direct(s, delivered, claim, at)
        }))
    }

    /// A transaction of SQLite's lane, begun by [`begin_lane`](Self::begin_lane).
    pub(crate) fn is_lane(&self) -> bool {
        self.lite_ref()
            .is_some_and(|t| matches!(t.held, Held::Lane(_)))
    }

    /// The SQLite connection, for sqlx (on the lane, its session ended first: see
    /// [`LaneConn::sqlx`]).
    pub(crate) fn sqlite_conn(&mut self) -> Option<&mut SqliteConnection> {
        Some(match &mut self.lite()?.held {
            Held::Own(tx) => tx,
            Held::Lane(lane) => lane.sqlx(),
        })
    }

    /// The connection locked for statements run directly (SQLite's lane), locked now
    /// if need be.
    pub(crate) async fn session(&mut self) -> Result<&mut crate::drivers::sqlite::direct::Session> {
        match self.lite().map(|t| &mut t.held) {
            Some(Held::Lane(lane)) => lane.session().await,
            _ => Err(crate::Error::BackendMismatch {
                store: "sqlite (lane)",
                connection: "a transaction of its own",
            }),
        }
    }

    /// Begins the lane's shared transaction (SQLite): on `spare`, the connection the
    /// lane kept from its last one, or on the writer taken from the pool.
    pub(crate) async fn begin_lane(store: &Store, spare: Option<Tx>) -> Result<Tx> {
        let mut t = match spare {
            Some(t) => t,
            None => {
                #[allow(irrefutable_let_patterns)] // a SQLite-only build has no other backend
                let Backend::Sqlite(db) = store.backend_ref() else {
                    // No lane on PostgreSQL: a transaction of its own.
                    return Self::begin(store).await;
                };
                let conn = db.writer.acquire().await?;
                Self::new(store, SqliteTx::of(Held::Lane(LaneConn::new(conn))))
            }
        };
        if let Some(SqliteTx {
            held: Held::Lane(lane),
            ..
        }) = t.lite()
        {
            lane.open = true;
        }
        t.lane_statement("BEGIN IMMEDIATE").await?;
        Ok(t)
    }

    /// Runs `BEGIN IMMEDIATE`, `COMMIT` or `ROLLBACK` on the lane's connection:
    /// directly, except a `BEGIN` that would wait for another process's write and a
    /// `COMMIT` that syncs to disk (`synchronous = FULL`), which sqlx's thread waits
    /// for instead of a tokio worker.
    async fn lane_statement(&mut self, sql: &'static str) -> Result<()> {
        let begin = sql.starts_with("BEGIN");
        let syncs = sql == "COMMIT"
            && self.store.config().synchronous == crate::store::config::Synchronous::Full;
        if !syncs {
            let busy_timeout = self.store.config().busy_timeout;
            let session = self.session().await?;
            if begin {
                session.busy_timeout(std::time::Duration::ZERO);
            }
            let ran = session.run(
                &crate::drivers::sqlite::statements::Statement::plain(sql),
                |_| {},
            );
            if begin {
                session.busy_timeout(busy_timeout);
            }
            match ran {
                Err(e) if begin && crate::drivers::sqlite::is_busy(&e) => {}
                ran => return ran,
            }
        }
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
    pub(crate) async fn end_lane(&mut self, commit: bool) -> Result<()> {
        self.drop_tail();
        self.defer = false;
        if commit {
            self.lane_statement("COMMIT").await?;
            Self::after_commit(&self.store, &mut self.handed, self.enqueued);
        } else {
            self.lane_statement("ROLLBACK").await?;
            self.handed.cancel_since(0);
        }
        self.enqueued = false;
        if let Some(SqliteTx {
            held: Held::Lane(lane),
            ..
        }) = self.lite()
        {
            lane.open = false;
        }
        Ok(())
    }

    /// Runs a hop's opening round trip on SQLite (see [`crate::drivers::sqlite::Sqlite::open_hop`]):
    /// in the lane on the connection directly, elsewhere through sqlx.
    async fn open_sqlite(
        &mut self,
        tail: Option<&mut crate::drivers::sqlite::tail::Tail>,
        prefix: &'static str,
        statements: usize,
        inbox: Option<(&str, MessageId)>,
        prefetch: Option<&crate::store::prefetch::Prefetch>,
    ) -> std::result::Result<
        crate::drivers::sqlite::open::Opened,
        crate::drivers::sqlite::open::OpenFailed,
    > {
        let failed = |error| crate::drivers::sqlite::open::OpenFailed {
            prefix_done: 0,
            error,
            tail_rows: Vec::new(),
        };
        let now = self.store.clock().now_ms();
        if !self.is_lane() {
            let Some(c) = self.sqlite_conn() else {
                return Err(failed(crate::Error::BackendMismatch {
                    store: "sqlite",
                    connection: "postgres",
                }));
            };
            return crate::drivers::sqlite::Sqlite::open_hop(
                c, tail, prefix, statements, inbox, prefetch, now,
            )
            .await;
        }
        let session = self.session().await.map_err(failed)?;
        crate::drivers::sqlite::Sqlite::open_hop_direct(
            session, tail, prefix, statements, inbox, prefetch, now,
        )
    }
}

/// Begins a shared transaction, on `spare` if there is one (see [`Tx::begin_lane`]).
pub(crate) async fn begin_shared(store: &Store, spare: Option<Tx>) -> Result<Tx> {
    Tx::begin_lane(store, spare).await
}

/// Commits or rolls back a shared transaction; its connection, if it can serve the
/// next one.
pub(crate) async fn end_shared(mut t: Tx, commit: bool) -> (Result<()>, Option<Tx>) {
    if t.is_lane() {
        let ended = t.end_lane(commit).await;
        let keep = ended.is_ok();
        return (ended, keep.then_some(t));
    }
    let ended = if commit {
        t.commit().await
    } else {
        t.rollback().await
    };
    (ended, None)
}

/// The savepoint each hop after the first runs in: undone, dropped.
const ROLLBACK_TO: &str = "ROLLBACK TO SAVEPOINT agentsaga_hop";
const RELEASE: &str = "RELEASE SAVEPOINT agentsaga_hop";

/// Rolls back to the hop's savepoint and drops it.
pub(crate) async fn undo(t: &mut Tx, mark: usize) -> Result<()> {
    t.cancel_handed_since(mark);
    t.savepoint_op(ROLLBACK_TO).await?;
    t.savepoint_op(RELEASE).await
}

/// The transaction cannot go on: roll it back and fail every hop kept in it.
pub(crate) async fn abort(t: Tx, kept: Vec<oneshot::Sender<Result<()>>>, why: &Error) {
    tracing::warn!(error = %why, hops = kept.len(), "a shared transaction failed; its hops will be retried");
    let _ = t.rollback().await;
    fail_all(kept, &format!("the shared transaction failed: {why}"));
}

pub(crate) fn fail_all(kept: Vec<oneshot::Sender<Result<()>>>, why: &str) {
    for done in kept {
        let _ = done.send(Err(Error::SharedCommit(why.to_owned())));
    }
}
