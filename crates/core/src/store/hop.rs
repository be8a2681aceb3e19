//! Group commit: hops that are ready at the same moment share one transaction.
//!
//! A *hop* is the unit of atomicity of a consumer (an agent's or an orchestrator's
//! handling of one message): its effects, its inbox record and its next messages
//! commit together or not at all. A hop does not need a commit of its own, and commits
//! are what a database does least of per second. So [`Store::hop`] queues the caller
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
//! open with a set read ([`Prefetch::with_set`]: an agent's hop that applies its answer
//! to a saga of this process) go to the set lanes ([`sets`](super::sets)), which batch
//! their reads and writes as well as their commit. Every other hop on PostgreSQL is a
//! transaction of its own, on its own pooled connection, as many at once as the pool
//! allows: shared transactions of hops that lock rows one at a time would hold them
//! all until their commit, and two that lock the same rows in different orders
//! deadlock (the set lanes lock a batch's sagas in one ordered statement).
//!
//! On SQLite the lane runs its statements on the connection directly, not through
//! sqlx's thread (see [`direct`](super::direct)), and keeps the connection from one
//! shared transaction to the next while callers keep coming (at most [`HOLD`]). A hop
//! costs as few statement groups as it can: the group that ends a hop (releases its
//! savepoint) also opens the next one (sets its savepoint, records its message in the
//! inbox, runs its [`Prefetch`] read), and starts with the ended hop's last write if
//! the hop deferred it ([`Tx::defer_next_write`]). The count of statements that
//! completed says whose failure a failed group was: the ended hop's (it alone is
//! undone), the transaction's (abandoned), or the next hop's (it alone fails).
//!
//! A hop holds its lane while it runs: its work should be statements, not waits on
//! the outside world (that is what an agent's `call` is for). The lanes' watchdog
//! ([`StoreConfig::hop_timeout`](crate::StoreConfig::hop_timeout)) bounds a hop's
//! turn: PostgreSQL's set lane ends a stuck batch's session and goes on; SQLite's lane
//! cannot take its writer back from the hop's holder, so it undoes a hop that comes
//! back past the bound (its commit fails) and logs the wait.

use std::collections::{HashSet, VecDeque};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot};

use super::conn::Tx;
use super::{Receipt, Store};
use crate::{Error, MessageId, Result};

/// Largest number of hops in one transaction: bounds how long a commit keeps the
/// first hop of a batch waiting.
const MAX_BATCH: usize = 64;

/// The savepoint each hop after the first runs in: set, undone, dropped.
const ROLLBACK_TO: &str = "ROLLBACK TO SAVEPOINT agentsaga_hop";
const RELEASE: &str = "RELEASE SAVEPOINT agentsaga_hop";
/// How a hop's first round trip begins (the hop's own statements, its inbox record,
/// follow in the same round trip): nothing (the first hop of a transaction), its
/// savepoint, or the release of the hop before it and its savepoint (on SQLite, one
/// hand-off to the connection's thread instead of up to three).
const OPEN_FIRST: (&str, usize) = ("", 0);
const OPEN_SET: (&str, usize) = ("SAVEPOINT agentsaga_hop;\n", 1);
const OPEN_RELEASE_AND_SET: (&str, usize) = (
    "RELEASE SAVEPOINT agentsaga_hop;\nSAVEPOINT agentsaga_hop;\n",
    2,
);
/// Ends a hop when no caller is waiting: the release of its savepoint alone.
const CLOSE: (&str, usize) = ("RELEASE SAVEPOINT agentsaga_hop;\n", 1);

/// A caller waiting for its turn in a shared transaction.
struct Request {
    store: Store,
    /// The message the hop records in the inbox first, if any.
    inbox: Option<(String, MessageId)>,
    /// The read the hop starts with, if any (SQLite).
    prefetch: Option<Prefetch>,
    turn: oneshot::Sender<Result<Turn>>,
}

/// A caller's turn: its hop, what its inbox record found, the rows its prefetch read.
pub(super) type Turn = (Hop, Option<Receipt>, Option<Prefetched>);

/// A read that a hop starts with, run (on SQLite) in the round trip that opens the hop
/// (its savepoint and inbox record) instead of a round trip of its own: the hop's
/// first statements and the read are one hand-off to the connection's thread.
///
/// The SQL is one statement whose parameters are plain `?`s (no numbers: the round trip
/// holds other statements' parameters too), bound as text in the order of
/// [`bind`](Self::bind); a `?` inside a string literal is taken for one, so write none.
/// It reads the database as the hop finds it when it opens: a hop that writes the rows
/// it prefetched must read them again. On PostgreSQL only the set form
/// ([`with_set`](Self::with_set)) is read, by the set lane; without it the hop reads
/// for itself.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))] // read by SQLite alone
pub struct Prefetch {
    pub(super) sql: String,
    pub(super) binds: Vec<String>,
    /// PostgreSQL's set lane: the key, and statements that read all the batch's keys
    /// at once.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(super) set: Option<(uuid::Uuid, &'static [&'static str])>,
}

impl Prefetch {
    /// A read of `sql` (one statement, parameters `?`).
    pub fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            binds: Vec::new(),
            set: None,
        }
    }

    /// The same read for PostgreSQL's set lane (see
    /// [`Store::hop_receiving_prefetched`]): `statements` run once for all the keys of
    /// a batch, in order, each with one parameter, the keys as `uuid[]` (`= ANY($1)`),
    /// each returning its rows with their key in a column `prefetch_key`. A hop gets
    /// the rows of its `key` ([`Prefetched::set_rows`]). Without it, a hop on
    /// PostgreSQL reads for itself.
    #[must_use]
    pub fn with_set(mut self, key: uuid::Uuid, statements: &'static [&'static str]) -> Self {
        self.set = Some((key, statements));
        self
    }

    /// Binds the next parameter, as text.
    #[must_use]
    pub fn bind(mut self, value: impl Into<String>) -> Self {
        self.binds.push(value.into());
        self
    }
}

/// The rows a [`Prefetch`] read when its hop opened.
#[derive(Default)]
pub struct Prefetched {
    #[cfg(feature = "sqlite")]
    pub(super) rows: Vec<super::direct::Row>,
    /// Per set statement, this hop's rows (PostgreSQL's set lane).
    #[cfg(feature = "postgres")]
    pub(super) set_rows: Vec<Vec<sqlx::postgres::PgRow>>,
}

impl std::fmt::Debug for Prefetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetched").finish_non_exhaustive()
    }
}

impl Prefetched {
    /// What a SQLite hop's opening read.
    #[cfg(feature = "sqlite")]
    pub(super) fn of_rows(rows: Vec<super::direct::Row>) -> Self {
        Self {
            rows,
            #[cfg(feature = "postgres")]
            set_rows: Vec::new(),
        }
    }

    /// The rows read, in the statement's order.
    #[cfg(feature = "sqlite")]
    pub fn rows(&self) -> &[super::direct::Row] {
        &self.rows
    }

    /// The rows of each of the prefetch's set statements ([`Prefetch::with_set`]) for
    /// this hop's key, in the statements' order; empty if the hop was not opened by
    /// PostgreSQL's set lane.
    #[cfg(feature = "postgres")]
    pub fn set_rows(&self) -> &[Vec<sqlx::postgres::PgRow>] {
        &self.set_rows
    }
}

/// How a hop gave its transaction back.
pub(super) enum End {
    /// Keep its effects; tell it whether the transaction committed.
    Commit(oneshot::Sender<Result<()>>),
    /// Undo its effects (dropped, rolled back, or its caller went away).
    Rollback,
}

pub(super) struct Back {
    pub(super) tx: Tx,
    pub(super) end: End,
}

/// The lanes of one store: created on the first hop.
#[derive(Debug, Default, Clone)]
pub(crate) struct Lanes {
    queue: Arc<OnceLock<mpsc::UnboundedSender<Request>>>,
    /// PostgreSQL's set lane.
    #[cfg(feature = "postgres")]
    sets: Arc<OnceLock<Vec<mpsc::UnboundedSender<super::sets::Request>>>>,
    counts: Arc<Counts>,
}

/// Hops committed and the commits they took, since the store was opened.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) hops: AtomicU64,
    pub(super) commits: AtomicU64,
    /// The lane holds the writer (a batch is running, or it keeps the connection
    /// between two).
    busy: std::sync::atomic::AtomicBool,
}

/// What group commit has done so far: [`Store::hop_stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HopStats {
    /// Hops committed.
    pub hops: u64,
    /// Shared transactions committed (each holding at least one hop).
    pub commits: u64,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Request")
    }
}

impl Lanes {
    fn sender(&self) -> &mpsc::UnboundedSender<Request> {
        self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(lane(rx, Arc::clone(&self.counts)));
            tx
        })
    }

    /// The set lane of saga `key`: always the same one, so that a saga's hops never
    /// wait for another lane's batch.
    #[cfg(feature = "postgres")]
    fn set_sender(&self, key: uuid::Uuid) -> &mpsc::UnboundedSender<super::sets::Request> {
        let lanes = self.sets.get_or_init(|| {
            (0..super::sets::LANES)
                .map(|_| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    tokio::spawn(super::sets::lane(rx, Arc::clone(&self.counts)));
                    tx
                })
                .collect()
        });
        &lanes[(key.as_u128() % lanes.len() as u128) as usize]
    }
}

/// One hop's turn in a shared transaction (on PostgreSQL, a transaction of its own):
/// use it as the [`Tx`] it derefs to, then [`commit`](Self::commit) it. Dropping it (or
/// [`rollback`](Self::rollback)) undoes this hop's effects only.
#[must_use = "a hop that is not committed is rolled back"]
pub struct Hop {
    tx: Option<Tx>,
    /// Where the shared transaction goes back to; `None` for a transaction of its own.
    back: Option<oneshot::Sender<Back>>,
    counts: Arc<Counts>,
}

impl std::fmt::Debug for Hop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hop").finish_non_exhaustive()
    }
}

impl Hop {
    /// A turn in a lane's shared transaction, given back through `back`.
    #[cfg(feature = "postgres")]
    pub(super) fn in_lane(tx: Tx, back: oneshot::Sender<Back>, counts: Arc<Counts>) -> Self {
        Self {
            tx: Some(tx),
            back: Some(back),
            counts,
        }
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

    /// Undoes this hop's effects (those of the other hops in the transaction stay).
    pub fn rollback(mut self) {
        let _ = self.give_back(End::Rollback);
    }

    /// Gives the transaction back to its lane; `false` if the lane no longer waits
    /// for it (the watchdog let it go, or the lane stopped): the transaction is
    /// dropped, nothing of this hop written.
    fn give_back(&mut self, end: End) -> bool {
        match (self.tx.take(), self.back.take()) {
            // The lane waits for this; if it is gone, so is the transaction.
            (Some(tx), Some(back)) => back.send(Back { tx, end }).is_ok(),
            // A transaction of its own: dropping it rolls it back.
            (tx, _) => {
                drop(tx);
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

/// What the commit of a hop that came back to SQLite's lane past its bound says.
const LATE: &str = "this hop held its turn in the shared transaction past \
     StoreConfig::hop_timeout: it was undone, nothing of it was written";

impl Store {
    /// Waits for a turn in a shared write transaction (group commit, see the `hop`
    /// module): the unit of work of a consumer, atomic on its own, committed with the
    /// other hops that were ready at the same moment.
    ///
    /// Use it like [`begin`](Self::begin)'s [`Tx`], for short work: while a hop runs,
    /// the hops queued behind it wait. It is how to write under load on SQLite (a
    /// batch of saga starts, say): a [`begin`](Self::begin) transaction takes the
    /// single writer away from the running hops instead. Never ask for a hop while
    /// holding one (inside an agent's handler, say): on SQLite it would wait for itself,
    /// and on PostgreSQL a hop of the set lane holds its batch's sagas locked (a
    /// transaction of its own that writes one of them waits for the batch, which
    /// waits for the hop, until the lane's watchdog ends the batch past
    /// [`StoreConfig::hop_timeout`](crate::StoreConfig::hop_timeout)).
    ///
    /// # Errors
    /// [`Error::SharedCommit`] (transient) if no transaction could be begun.
    pub async fn hop(&self) -> Result<Hop> {
        Ok(self.turn(None, None).await?.0)
    }

    /// A [`hop`](Self::hop) that first records `message_id` in `consumer`'s inbox, as
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
    /// without a prefetch: the hop reads for itself). On PostgreSQL a prefetch with a
    /// set form ([`Prefetch::with_set`]) sends the hop to a set lane (unless
    /// [`StoreConfig::set_lane`](crate::StoreConfig::set_lane) is off or a
    /// [`max_pending`](crate::StoreConfig::max_pending) limit is set), which reads it
    /// for the whole batch at once and keeps the writes its hops hand over as data
    /// ([`Tx::take_set_deferral`]); without one, the hop is a transaction of its own
    /// and reads nothing (`None`). The rows are read after the inbox record, whatever
    /// it found (on the set lane, only for a first delivery).
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
        Ok((hop, receipt, read))
    }

    async fn turn(
        &self,
        inbox: Option<(String, MessageId)>,
        prefetch: Option<Prefetch>,
    ) -> Result<Turn> {
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns)]
        if let super::backend::Backend::Postgres(_) = self.backend_ref() {
            if let (Some((consumer, id)), Some((key, statements))) =
                (&inbox, prefetch.as_ref().and_then(|p| p.set))
                && self.config().set_lane
                && self.config().max_pending.is_none()
            {
                let (turn, mine) = oneshot::channel();
                let request = super::sets::Request {
                    store: self.clone(),
                    consumer: consumer.clone(),
                    id: *id,
                    key,
                    statements,
                    turn,
                };
                if self.lanes.set_sender(key).send(request).is_err() {
                    return Err(Error::SharedCommit("the set lane stopped".into()));
                }
                return mine
                    .await
                    .unwrap_or_else(|_| Err(Error::SharedCommit("the set lane stopped".into())));
            }
            let hop = Hop {
                tx: Some(Tx::begin(self).await?),
                back: None,
                counts: Arc::clone(&self.lanes.counts),
            };
            return Ok((hop, None, None));
        }
        let (turn, mine) = oneshot::channel();
        let request = Request {
            store: self.clone(),
            inbox,
            prefetch,
            turn,
        };
        if self.lanes.sender().send(request).is_err() {
            return Err(Error::SharedCommit("the commit lanes stopped".into()));
        }
        mine.await
            .unwrap_or_else(|_| Err(Error::SharedCommit("the commit lane stopped".into())))
    }
}

impl Store {
    /// Does SQLite's lane hold the writer right now (running a batch, or keeping the
    /// connection between two, see [`HOLD`])? A writer that would wait for it may
    /// rather join it as a hop.
    #[cfg(feature = "sqlite")]
    pub(crate) fn hops_running(&self) -> bool {
        self.lanes.counts.busy.load(Ordering::Acquire)
    }

    /// How many hops group commit has committed, in how many transactions.
    pub fn hop_stats(&self) -> HopStats {
        HopStats {
            hops: self.lanes.counts.hops.load(Ordering::Relaxed),
            commits: self.lanes.counts.commits.load(Ordering::Relaxed),
        }
    }
}

/// How long the lane keeps its connection (SQLite's writer) from one shared
/// transaction to the next while callers keep coming: past it, the connection goes back
/// to the pool between two, so that the store's other writers (a [`Store::begin`], the
/// relay's statements outside hops) get their turn. Keeping it saves giving it back
/// (sqlx pings a connection it takes back) and taking it again, a few round trips to
/// the connection's thread per transaction.
const HOLD: std::time::Duration = std::time::Duration::from_millis(10);

/// A lane: takes the waiting callers, a batch at a time, until the store is dropped.
async fn lane(mut queue: mpsc::UnboundedReceiver<Request>, counts: Arc<Counts>) {
    // The connection kept from the last batch, and since when it is held.
    let mut spare: Option<(Tx, std::time::Instant)> = None;
    // Callers put back by the last batch (their message was recorded in it): first.
    let mut held: VecDeque<Request> = VecDeque::new();
    loop {
        let first = match held.pop_front().map_or_else(|| queue.try_recv(), Ok) {
            Ok(first) => first,
            Err(mpsc::error::TryRecvError::Disconnected) => break,
            Err(mpsc::error::TryRecvError::Empty) => {
                // Idle: the connection is kept for the rest of its time, then goes back
                // to the pool.
                let waited = match &spare {
                    Some((_, since)) => {
                        let left = HOLD.saturating_sub(since.elapsed());
                        tokio::time::timeout(left, queue.recv()).await.ok()
                    }
                    None => None,
                };
                match waited {
                    Some(Some(first)) => first,
                    Some(None) => break,
                    None => {
                        spare = None;
                        counts.busy.store(false, Ordering::Release);
                        match queue.recv().await {
                            Some(first) => first,
                            None => break,
                        }
                    }
                }
            }
        };
        if spare
            .as_ref()
            .is_some_and(|(_, since)| since.elapsed() >= HOLD)
        {
            spare = None;
        }
        let since = spare.as_ref().map(|(_, since)| *since);
        counts.busy.store(true, Ordering::Release);
        let kept = batch(
            first,
            &mut queue,
            &mut held,
            &counts,
            spare.take().map(|(t, _)| t),
        )
        .await;
        spare = kept.map(|t| (t, since.unwrap_or_else(std::time::Instant::now)));
        if spare.is_none() {
            counts.busy.store(false, Ordering::Release);
        }
    }
    counts.busy.store(false, Ordering::Release);
}

/// Begins a shared transaction, on `spare` if there is one (see [`Tx::begin_lane`]).
async fn begin_shared(store: &Store, spare: Option<Tx>) -> Result<Tx> {
    #[cfg(feature = "sqlite")]
    {
        Tx::begin_lane(store, spare).await
    }
    #[cfg(not(feature = "sqlite"))]
    {
        drop(spare);
        Tx::begin(store).await
    }
}

/// Commits or rolls back a shared transaction; its connection, if it can serve the
/// next one.
#[cfg_attr(not(feature = "sqlite"), allow(unused_mut))]
async fn end_shared(mut t: Tx, commit: bool) -> (Result<()>, Option<Tx>) {
    #[cfg(feature = "sqlite")]
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

/// A message recorded in the inbox by a hop of the open shared transaction.
type Recorded = HashSet<(String, MessageId)>;

/// The next caller that may join the batch: the first waiting (those `held` back by
/// the last batch first) whose message no hop of the open transaction has recorded.
/// The others are put back in `again`, for the next batch: a second delivery of a
/// message is answered only once the first's commit is known (a duplicate if it
/// committed; if it failed, the second delivery is the first that counts).
fn pull(
    queue: &mut mpsc::UnboundedReceiver<Request>,
    held: &mut VecDeque<Request>,
    recorded: &Recorded,
    again: &mut VecDeque<Request>,
) -> Option<Request> {
    loop {
        let r = held.pop_front().or_else(|| queue.try_recv().ok())?;
        if r.inbox.as_ref().is_some_and(|m| recorded.contains(m)) {
            again.push_back(r);
            continue;
        }
        return Some(r);
    }
}

/// Runs one shared transaction: hands it to `first`, then to each caller waiting,
/// then commits and answers them all. Callers whose message a hop of the transaction
/// recorded are put back in `held`, first for the next batch.
async fn batch(
    first: Request,
    queue: &mut mpsc::UnboundedReceiver<Request>,
    held: &mut VecDeque<Request>,
    counts: &Arc<Counts>,
    spare: Option<Tx>,
) -> Option<Tx> {
    let mut again = VecDeque::new();
    let kept = batch_of(first, queue, held, &mut again, counts, spare).await;
    again.extend(held.drain(..));
    *held = again;
    kept
}

async fn batch_of(
    first: Request,
    queue: &mut mpsc::UnboundedReceiver<Request>,
    held: &mut VecDeque<Request>,
    again: &mut VecDeque<Request>,
    counts: &Arc<Counts>,
    mut spare: Option<Tx>,
) -> Option<Tx> {
    let mut next = Some(first);
    // The messages the hops of the open transaction recorded.
    let mut recorded = Recorded::new();
    // The hops kept so far, waiting for the commit.
    let mut kept: Vec<oneshot::Sender<Result<()>>> = Vec::new();
    let mut tx: Option<Tx> = None;
    let mut taken = 0usize;
    // The next hop was opened (savepoint set, inbox recorded) by the round trip that
    // released the hop before it: what its inbox record found.
    let mut opened: Option<(Option<Receipt>, Option<Prefetched>)> = None;
    while let Some(request) = next.take().or_else(|| {
        if taken < MAX_BATCH {
            pull(queue, held, &recorded, again)
        } else {
            None
        }
    }) {
        taken += 1;
        if taken > 2 * MAX_BATCH {
            // Transactions keep failing: let the callers' retries take it from here.
            let _ = request.turn.send(Err(Error::SharedCommit(
                "shared transactions keep failing".into(),
            )));
            break;
        }
        let mut t = match tx.take() {
            Some(t) => t,
            None => match begin_shared(&request.store, spare.take()).await {
                Ok(t) => {
                    recorded.clear();
                    t
                }
                Err(e) => {
                    // Nothing kept yet (a transaction is begun only with none open).
                    let _ = request.turn.send(Err(e));
                    continue;
                }
            },
        };
        let savepoint = !kept.is_empty();
        let (receipt, read) = match opened.take() {
            Some(opened) => opened,
            None => {
                let (prefix, statements) = if savepoint { OPEN_SET } else { OPEN_FIRST };
                let inbox = request.inbox.as_ref().map(|(c, id)| (c.as_str(), *id));
                match t
                    .open_hop(prefix, statements, inbox, request.prefetch.as_ref())
                    .await
                {
                    Ok(opened) => opened,
                    Err((done, e)) if done < statements => {
                        // The savepoint failed: the transaction is failed (on
                        // PostgreSQL, a statement of the first hop, which has no
                        // savepoint, failed and the hop committed anyway), so its hops
                        // are not written. This caller gets a fresh transaction.
                        abort(t, std::mem::take(&mut kept), &e).await;
                        next = Some(request);
                        continue;
                    }
                    Err((_, e)) => {
                        // Its inbox record failed: this hop alone fails.
                        let _ = request.turn.send(Err(e));
                        if savepoint {
                            let mark = t.handed_mark();
                            if let Err(e) = undo(&mut t, mark).await {
                                abort(t, std::mem::take(&mut kept), &e).await;
                                continue;
                            }
                            tx = Some(t);
                        } else if let Err(e) = t.rollback().await {
                            tracing::debug!(error = %e, "rollback of a shared transaction failed");
                        }
                        continue;
                    }
                }
            }
        };
        if receipt == Some(Receipt::First)
            && let Some(m) = &request.inbox
        {
            recorded.insert(m.clone());
        }
        let mark = t.handed_mark();
        let (back, returned) = oneshot::channel();
        let hop = Hop {
            tx: Some(t),
            back: Some(back),
            counts: Arc::clone(counts),
        };
        // A caller that went away drops the hop it is sent, which gives it back.
        let _ = request.turn.send(Ok((hop, receipt, read)));
        let bound = request.store.config().hop_timeout;
        let mut returned = returned;
        let (returned, late) = match tokio::time::timeout(bound, &mut returned).await {
            Ok(returned) => (returned, false),
            Err(_) => {
                // The watchdog. The hop holds the single writer (its transaction is
                // the lane's, and the holder may hold a borrow of its connection):
                // the lane cannot take it back, only wait, and undo the hop when it
                // returns.
                tracing::error!(
                    bound_ms = bound.as_millis() as u64,
                    hops = kept.len(),
                    "a hop has held SQLite's lane past hop_timeout: every write of the process waits for it; it will be undone when it returns"
                );
                (returned.await, true)
            }
        };
        let Ok(Back { tx: mut t, end }) = returned else {
            // The transaction was lost with its caller (it cannot be: a hop gives it
            // back when dropped); what was kept is not written.
            fail_all(kept, "a shared transaction was lost");
            return None;
        };
        let end = match end {
            End::Commit(done) if late => {
                // Past its bound: undone like a rollback, and told so.
                let _ = done.send(Err(Error::SharedCommit(LATE.into())));
                End::Rollback
            }
            end => end,
        };
        match (end, savepoint) {
            (End::Commit(done), false) => {
                kept.push(done);
                tx = Some(t);
            }
            (End::Commit(done), true) => {
                // The release; a caller already waiting is opened in the same round
                // trip.
                let ahead = if taken < MAX_BATCH {
                    pull(queue, held, &recorded, again)
                } else {
                    None
                };
                let (prefix, statements) = if ahead.is_some() {
                    OPEN_RELEASE_AND_SET
                } else {
                    CLOSE
                };
                let inbox = ahead
                    .as_ref()
                    .and_then(|a| a.inbox.as_ref())
                    .map(|(c, id)| (c.as_str(), *id));
                let prefetch = ahead.as_ref().and_then(|a| a.prefetch.as_ref());
                let opening = t.open_hop(prefix, statements, inbox, prefetch).await;
                next = ahead;
                match opening {
                    Ok(receipt) => {
                        kept.push(done);
                        tx = Some(t);
                        if next.is_some() {
                            opened = Some(receipt);
                        }
                    }
                    // The release failed (its statements left the transaction failed:
                    // PostgreSQL refuses to release then): undo this hop alone; the
                    // caller ahead opens its hop in a round trip of its own.
                    Err((0, e)) => match undo(&mut t, mark).await {
                        Ok(()) => {
                            let _ = done.send(Err(e));
                            tx = Some(t);
                        }
                        Err(e2) => {
                            let _ = done.send(Err(e));
                            abort(t, std::mem::take(&mut kept), &e2).await;
                        }
                    },
                    Err((1, e)) => {
                        // Released, but no new savepoint: the transaction cannot be
                        // trusted. Nothing of it is written, this hop included; the
                        // caller ahead gets a fresh transaction.
                        kept.push(done);
                        abort(t, std::mem::take(&mut kept), &e).await;
                    }
                    Err((_, e)) => {
                        // This hop is kept; the inbox record of the caller ahead
                        // failed: that hop alone fails.
                        kept.push(done);
                        if let Some(ahead) = next.take() {
                            let _ = ahead.turn.send(Err(e));
                        }
                        let mark = t.handed_mark();
                        match undo(&mut t, mark).await {
                            Ok(()) => tx = Some(t),
                            Err(e2) => abort(t, std::mem::take(&mut kept), &e2).await,
                        }
                    }
                }
            }
            (End::Rollback, false) => {
                // The first hop: rolling back the transaction undoes only it.
                t.drop_tail();
                let (ended, kept_conn) = end_shared(t, false).await;
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "rollback of a shared transaction failed");
                }
                spare = kept_conn;
            }
            (End::Rollback, true) => {
                t.drop_tail();
                if let Err(e) = undo(&mut t, mark).await {
                    abort(t, std::mem::take(&mut kept), &e).await;
                    continue;
                }
                tx = Some(t);
            }
        }
    }
    let Some(mut t) = tx else { return spare };
    // The last write the first hop deferred, if it was the only one.
    if let Err(e) = t.flush_tail().await {
        abort(t, kept, &e).await;
        return None;
    }
    crash_hook::stop_if(crash_hook::At::Before, kept.len()).await;
    let (committed, kept_conn) = end_shared(t, true).await;
    match committed {
        Ok(()) => {
            crash_hook::stop_if(crash_hook::At::After, kept.len()).await;
            counts.commits.fetch_add(1, Ordering::Relaxed);
            counts.hops.fetch_add(kept.len() as u64, Ordering::Relaxed);
            for done in kept {
                let _ = done.send(Ok(()));
            }
        }
        Err(e) => fail_all(kept, &format!("the shared commit failed: {e}")),
    }
    kept_conn
}

/// Rolls back to the hop's savepoint and drops it.
async fn undo(t: &mut Tx, mark: usize) -> Result<()> {
    t.cancel_handed_since(mark);
    t.savepoint_op(ROLLBACK_TO).await?;
    t.savepoint_op(RELEASE).await
}

/// The transaction cannot go on: roll it back and fail every hop kept in it.
async fn abort(t: Tx, kept: Vec<oneshot::Sender<Result<()>>>, why: &Error) {
    tracing::warn!(error = %why, hops = kept.len(), "a shared transaction failed; its hops will be retried");
    let _ = t.rollback().await;
    fail_all(kept, &format!("the shared transaction failed: {why}"));
}

fn fail_all(kept: Vec<oneshot::Sender<Result<()>>>, why: &str) {
    for done in kept {
        let _ = done.send(Err(Error::SharedCommit(why.to_owned())));
    }
}

/// A test hook for crash tests, off unless the environment variable
/// `AGENTSAGA_TEST_STOP_AT_SHARED_COMMIT` is `before:<n>[:<skip>]` or
/// `after:<n>[:<skip>]`: past the first `skip` (default 0) shared transactions holding
/// at least `n` hops, the next one stops its lane just before (or just after) its
/// commit, forever, and says so on stderr, so that a test can `kill -9` the process
/// there. Read once; any other value is ignored.
pub(super) mod crash_hook {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Where in the commit to stop.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(in crate::store) enum At {
        Before,
        After,
    }

    const VAR: &str = "AGENTSAGA_TEST_STOP_AT_SHARED_COMMIT";

    /// (where, at least this many hops, after skipping this many such commits)
    fn setting() -> Option<(At, usize, usize)> {
        static SETTING: OnceLock<Option<(At, usize, usize)>> = OnceLock::new();
        *SETTING.get_or_init(|| {
            let value = std::env::var(VAR).ok()?;
            let mut parts = value.split(':');
            let at = match parts.next()? {
                "before" => At::Before,
                "after" => At::After,
                _ => return None,
            };
            let n = parts.next()?.parse().ok()?;
            let skip = match parts.next() {
                Some(skip) => skip.parse().ok()?,
                None => 0,
            };
            Some((at, n, skip))
        })
    }

    /// Stops forever here if the hook is set for `at` and `hops` reaches its count.
    pub(in crate::store) async fn stop_if(at: At, hops: usize) {
        static SEEN: AtomicUsize = AtomicUsize::new(0);
        let Some((when, n, skip)) = setting() else {
            return;
        };
        if when != at || hops < n || SEEN.fetch_add(1, Ordering::SeqCst) != skip {
            return;
        }
        let at = match at {
            At::Before => "before",
            At::After => "after",
        };
        eprintln!("{VAR}: stopped {at} the shared commit of {hops} hops");
        std::future::pending::<()>().await;
    }
}
