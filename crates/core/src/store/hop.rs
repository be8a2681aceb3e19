//! Group commit: hops that are ready at the same moment share one transaction.
//!
//! A *hop* is the unit of atomicity of a consumer (an agent's or an orchestrator's
//! handling of one message): its effects, its inbox record and its next messages
//! commit together or not at all. A hop does not need a commit of its own, and commits
//! are what a database does least of per second. So a hop (and, while hops run on SQLite,
//! a [`Store::begin`]) queues the caller
//! for a *lane*: a task that owns one open transaction and hands it to each waiting
//! caller in turn. Every hop after the first in a transaction runs inside a savepoint,
//! so a hop that rolls back undoes only itself; the first needs none (rolling back the
//! transaction undoes only it, and the lane begins a fresh one). When no caller is
//! waiting, the lane commits and answers every hop of the batch: a hop counts as
//! committed only then.
//!
//! Batching happens only under load: a lane takes the callers already waiting and
//! never waits for more, so a lone hop costs its own transaction and two task
//! hand-offs.
//!
//! A batch takes a message at most once: a caller whose message a hop of the open
//! transaction recorded in the inbox (a redelivery) is put back, first for the next
//! batch. It then learns it is a duplicate only if the first hop committed; had it
//! been told so in the same batch, a failed commit would have left the message
//! acknowledged with no effects.
//!
//! SQLite has one lane: its single writer, which writers take turns on anyway. On
//! PostgreSQL a statement costs its execution, not its commit, so sharing commits buys
//! little there; what does is statements that serve many hops at once. The hops that
//! open with a [`Prefetch`] (an agent's hop that applies its answer
//! to a saga of this process) go to the set lanes (the driver's `sets.rs`), which batch
//! their reads and writes as well as their commit. Every other hop on PostgreSQL is a
//! transaction of its own, on its own pooled connection, as many at once as the pool
//! allows: shared transactions of hops that lock rows one at a time would hold them
//! all until their commit, and two that lock the same rows in different orders
//! deadlock (the set lanes lock a batch's sagas in one ordered statement).
//!
//! On SQLite the lane runs its statements on the connection directly, not through
//! sqlx's thread (see the driver's `direct.rs`), and keeps the connection from one
//! shared transaction to the next while callers keep coming (at most the lane's `HOLD`). A hop
//! costs as few statement groups as it can: the group that ends a hop (releases its
//! savepoint) also opens the next one (sets its savepoint, records its message in the
//! inbox, runs its [`Prefetch`] read), and starts with the ended hop's last write if
//! the hop deferred it ([`Hop::defer_next_write`](crate::Hop::defer_next_write)). The count of statements that
//! completed says whose failure a failed group was: the ended hop's (it alone is
//! undone), the transaction's (abandoned), or the next hop's (it alone fails).
//!
//! A hop holds its lane while it runs: its work should be statements, not waits on
//! the outside world (that is what an agent's `call` is for). The lanes' watchdog
//! ([`StoreConfig::hop_timeout`](crate::StoreConfig::hop_timeout)) bounds a hop's
//! turn: PostgreSQL's set lane ends a stuck batch's session and goes on; SQLite's lane
//! cannot take its writer back from the hop's holder, so it undoes a hop that comes
//! back past the bound (its commit fails) and logs the wait.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use tokio::sync::oneshot;

use super::backend::Driver;
use super::prefetch::{Prefetch, Prefetched};
use super::types::{Admitted, Counts, End, GivenBack, Hop, HopStats, Lanes, Tx};
use super::{Receipt, Store};
use crate::drivers::on_backend;
use crate::{Error, MessageId, Result};

impl Hop {
    /// A turn in a lane's shared transaction, given back through `back`.
    pub(crate) fn in_lane(tx: Tx, back: oneshot::Sender<GivenBack>, counts: Arc<Counts>) -> Self {
        Self {
            tx: Some(tx),
            back: Some(back),
            counts,
        }
    }

    /// A transaction of its own (PostgreSQL's hops outside the set lane).
    pub(crate) fn own(tx: Tx, counts: Arc<Counts>) -> Self {
        Self {
            tx: Some(tx),
            back: None,
            counts,
        }
    }

    /// Lets this hop's last write ([`Tx::write_last`]) be run later, as its driver
    /// sees fit: on SQLite's lane in the round trip that ends the hop (with the release
    /// of its savepoint and the opening of the next hop) instead of a round trip of its
    /// own; on PostgreSQL's set lane kept as data and written with the batch's other
    /// hops' rows in one statement per table. Its errors then come from
    /// [`commit`](Self::commit), and the hop is undone. Call it only when that write is
    /// the hop's last statement. In a hop that is a transaction of its own (PostgreSQL
    /// outside the set lane) it changes nothing.
    pub fn defer_next_write(&mut self) {
        if let Some(tx) = self.tx.as_mut() {
            tx.defer_next_write();
        }
    }

    /// Whether nothing was done in this hop since it opened (with its inbox record
    /// and its prefetch read): no statement through [`Tx::conn`], no read, no write,
    /// no message. Rolling such a hop back would undo only its inbox record, so a caller
    /// that would roll it back to record something else in a fresh hop (an agent's
    /// failure) may record it in this one instead.
    pub fn is_untouched(&self) -> bool {
        self.tx.as_ref().is_some_and(|tx| !tx.touched)
    }

    /// Keeps this hop's effects, and waits until the shared transaction commits.
    ///
    /// # Errors
    /// [`Error::Database`] if this hop's effects could not be kept;
    /// [`Error::SharedCommit`] (transient) if the shared transaction failed: nothing of
    /// this hop was written.
    pub async fn commit(mut self) -> Result<()> {
        if self.back.is_none() {
            let Some(tx) = self.tx.take() else {
                return Ok(());
            };
            self.let_go();
            tx.commit().await?;
            self.counts.commits.fetch_add(1, Ordering::Relaxed);
            self.counts.hops.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let (done, committed) = oneshot::channel();
        if !self.give_back(End::Commit(done)) {
            return Err(Error::SharedCommit(LET_GO.into()));
        }
        committed
            .await
            .unwrap_or_else(|_| Err(Error::SharedCommit("the commit lane stopped".into())))
    }

    /// Undoes this transaction's effects (in a shared transaction, those of the other
    /// hops in it stay). Dropping it does the same.
    ///
    /// # Errors
    /// [`Error::Database`] if a transaction of its own could not be rolled back (the
    /// database then undoes it when the connection closes).
    pub async fn rollback(mut self) -> Result<()> {
        if self.back.is_none()
            && let Some(tx) = self.tx.take()
        {
            self.let_go();
            return tx.rollback().await;
        }
        let _ = self.give_back(End::Rollback);
        Ok(())
    }

    /// This task no longer holds the single writer through this hop (SQLite's): it
    /// may begin again at once.
    fn let_go(&self) {
        let mut holder = self
            .counts
            .holder
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if holder.take().is_some() {
            self.counts.released.notify_waiters();
        }
    }

    /// Gives the transaction back to its lane; `false` if the lane no longer waits
    /// for it (the watchdog let it go, or the lane stopped): the transaction is
    /// dropped, nothing of this hop written.
    fn give_back(&mut self, end: End) -> bool {
        match (self.tx.take(), self.back.take()) {
            // The lane waits for this; if it is gone, so is the transaction.
            (Some(tx), Some(back)) => {
                self.let_go();
                back.send(GivenBack { tx, end }).is_ok()
            }
            // A transaction of its own: dropping it rolls it back.
            (tx, _) => {
                drop(tx);
                self.let_go();
                true
            }
        }
    }
}

impl Deref for Hop {
    type Target = Tx;
    fn deref(&self) -> &Tx {
        self.tx
            .as_ref()
            .expect("a hop's transaction is present until it ends")
    }
}

impl DerefMut for Hop {
    fn deref_mut(&mut self) -> &mut Tx {
        self.tx
            .as_mut()
            .expect("a hop's transaction is present until it ends")
    }
}

impl Drop for Hop {
    fn drop(&mut self) {
        let _ = self.give_back(End::Rollback);
    }
}

/// What the commit of a hop that its lane let go says.
const LET_GO: &str = "the lane let this hop go (it held its turn past StoreConfig::hop_timeout, \
     or the lane stopped): nothing of it was written";

impl Store {
    /// Begins a write transaction: use it as the [`Tx`] it derefs to (`tx.enqueue(…)`,
    /// `tx.conn()` for your own statements), then [`commit`](Hop::commit) it, which also
    /// wakes the relays of this process (and, on PostgreSQL, of others) if it enqueued
    /// anything. Dropping it, or [`rollback`](Hop::rollback), undoes it.
    ///
    /// The store chooses how it runs. On SQLite, while the runtime's hops are running
    /// (they hold the single writer in a shared transaction, see the `hop` module), it
    /// is a turn in that transaction, in a savepoint of its own: it waits for the hops
    /// queued before it, the ones after it wait for it, and it commits with them. When
    /// they are not running, and always on PostgreSQL, it is a transaction of its own.
    /// Either way it is atomic on its own, and [`commit`](Hop::commit) returns once it
    /// is written.
    ///
    /// Keep it short, statements rather than waits on the outside world: on SQLite
    /// every writer of the process waits while it is open. A turn held past
    /// [`StoreConfig::hop_timeout`](crate::StoreConfig::hop_timeout) (30 s unless set)
    /// is undone when it comes back: its commit fails with [`Error::SharedCommit`] and
    /// nothing of it is written.
    ///
    /// Never begin a second transaction while holding one, in an agent's handler say
    /// (use its `ctx.tx()`): on SQLite it would wait for itself, so a task that asks
    /// again while it holds one waits at most `hop_timeout`, for a transaction of a
    /// future beside it (`join!`) to end, and is then refused
    /// ([`Error::NestedTransaction`]) instead of hanging; on PostgreSQL an
    /// agent's transaction may hold its saga locked, and a second one that writes that
    /// saga waits until the lane's watchdog ends the first.
    ///
    /// # Errors
    /// [`Error::NestedTransaction`] as above; [`Error::SharedCommit`] (transient) if the
    /// shared transaction could not be begun; [`Error::Database`] if no connection can
    /// be had.
    pub async fn begin(&self) -> Result<Hop> {
        on_backend!(self.backend_ref(), b => b.begin(self).await)
    }

    /// (feature `testing`) A turn in SQLite's lane whatever the load, where
    /// [`begin`](Self::begin) begins a transaction of its own while no hop runs: for tests
    /// of what runs in a shared transaction (behind a turn held open, in a savepoint).
    /// On PostgreSQL, a transaction of its own.
    ///
    /// # Errors
    /// As [`begin`](Self::begin).
    #[cfg(feature = "testing")]
    pub async fn lane_turn(&self) -> Result<Hop> {
        self.hop().await
    }

    /// A turn in the lane's shared transaction whatever the load (on PostgreSQL, a
    /// transaction of its own): the relay's statements that join the running hops.
    pub(crate) async fn hop(&self) -> Result<Hop> {
        Ok(self.turn(None, None).await?.0)
    }

    /// A turn for a consumer's hop (a turn in SQLite's lane whatever the load; on
    /// PostgreSQL, a transaction of its own) that first records `message_id` in `consumer`'s inbox, as
    /// [`Tx::receive`] would. On SQLite that record shares its round trip with the
    /// savepoint statements of the shared transaction. On a
    /// [`Receipt::Duplicate`], drop the hop.
    ///
    /// # Errors
    /// [`Error::SharedCommit`] (transient) if no transaction could be begun;
    /// [`Error::Database`] if the record failed (this hop is then undone).
    pub async fn hop_receiving(
        &self,
        consumer: &str,
        message_id: MessageId,
    ) -> Result<(Hop, Receipt)> {
        let (hop, receipt, _) = self
            .hop_receiving_prefetched(consumer, message_id, None)
            .await?;
        Ok((hop, receipt))
    }

    /// A [`hop_receiving`](Self::hop_receiving) that also runs `prefetch` when it
    /// opens, in the same round trip on SQLite: its rows come with the hop (`None`
    /// without a prefetch: the hop reads for itself). On PostgreSQL a prefetch sends
    /// the hop to a set lane (unless
    /// [`StoreConfig::set_lane`](crate::StoreConfig::set_lane) is off or a
    /// [`max_pending`](crate::StoreConfig::max_pending) limit is set), which reads it
    /// for the whole batch at once and keeps the last writes its hops hand over as data
    /// ([`Tx::write_last`]); otherwise the hop is a transaction of its own and reads
    /// nothing (`None`). The rows are read after the inbox record, whatever it found
    /// (on the set lane, only for a first delivery).
    ///
    /// # Errors
    /// As [`hop_receiving`](Self::hop_receiving); on SQLite a failed read fails this
    /// hop alone, like a failed inbox record; on PostgreSQL's set lane a failed read or
    /// inbox record fails the hops of its batch ([`Error::SharedCommit`]).
    pub async fn hop_receiving_prefetched(
        &self,
        consumer: &str,
        message_id: MessageId,
        prefetch: Option<Prefetch>,
    ) -> Result<(Hop, Receipt, Option<Prefetched>)> {
        let (mut hop, receipt, read) = self
            .turn(Some((consumer.to_owned(), message_id)), prefetch)
            .await?;
        let receipt = match receipt {
            Some(r) => r,
            None => hop.receive(consumer, message_id).await?,
        };
        if let Some(tx) = hop.tx.as_mut() {
            tx.touched = false;
        }
        Ok((hop, receipt, read))
    }

    /// The hop API's one match on the driver: each driver's lane takes the turn.
    async fn turn(
        &self,
        inbox: Option<(String, MessageId)>,
        prefetch: Option<Prefetch>,
    ) -> Result<Admitted> {
        on_backend!(self.backend_ref(), b => b.admit(self, inbox, prefetch).await)
    }

    /// The lanes of this store.
    pub(crate) fn lanes(&self) -> &Lanes {
        &self.lanes
    }
}

impl Store {
    /// Does a lane hold the single writer right now (SQLite's, running a batch or
    /// keeping the connection between two)? A writer that would wait for it may
    /// rather join it as a hop. Never for a driver without a single writer.
    pub(crate) fn hops_running(&self) -> bool {
        self.lanes.counts.busy.load(Ordering::Acquire)
    }

    /// Waits until the caller (its task, or its thread outside one) does not hold
    /// the single writer: a future beside the holding one in the same task (`join!`)
    /// waits for it to let go; a caller that still holds it after
    /// [`hop_timeout`](crate::StoreConfig::hop_timeout) is nesting (its transaction
    /// waits for this one, which would wait for it).
    ///
    /// # Errors
    /// [`Error::NestedTransaction`] then.
    #[allow(dead_code, reason = "for a driver with a single writer")]
    pub(crate) async fn not_holding(&self) -> Result<()> {
        // Nearly every turn: not the holder, no waiter to make.
        if !self.holds_writer() {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + self.config.hop_timeout;
        loop {
            let released = self.lanes.counts.released.notified();
            let mut released = std::pin::pin!(released);
            // Registered before the look: a release between the two is not missed.
            released.as_mut().enable();
            if !self.holds_writer() {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return if self.holds_writer() {
                    Err(Error::NestedTransaction)
                } else {
                    Ok(())
                };
            }
        }
    }

    /// Does the caller (its task, or its thread outside one) hold the single writer
    /// (a turn in the lane, or a transaction of its own)?
    #[allow(dead_code, reason = "for a driver with a single writer")]
    pub(crate) fn holds_writer(&self) -> bool {
        *self
            .lanes
            .counts
            .holder
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            == Some(super::types::Caller::current())
    }

    /// How many hops group commit has committed, in how many transactions.
    pub fn hop_stats(&self) -> HopStats {
        HopStats {
            hops: self.lanes.counts.hops.load(Ordering::Relaxed),
            commits: self.lanes.counts.commits.load(Ordering::Relaxed),
        }
    }
}
