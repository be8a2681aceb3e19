//! The store's handles, declared together because they hold one another: a [`Store`]
//! keeps its lanes, a lane hands out [`Hop`]s, a hop holds a [`Tx`], and a
//! transaction holds its store. What each does is beside its kind: the store in
//! `store.rs`, a transaction in `tx.rs` (and each driver's side in its folder's `tx.rs`),
//! a hop in `hop.rs`, the lanes in the drivers' folders.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot};

use super::config::StoreConfig;
use super::conn::Receipt;
use super::handover::{Handed, Handover, Slot};
use super::prefetch::{Prefetch, Prefetched};
use super::wake::Wakeups;
use crate::drivers::{Backend, TxOf};
use crate::{MessageId, Result};

/// A handle to the database holding the outbox and the inbox. Cheap to clone.
///
/// ```
/// # #[cfg(feature = "sqlite")] // the example runs on an in-memory SQLite database
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), agentsaga_core::Error> {
/// use agentsaga_core::{Message, Store};
///
/// let store = Store::connect("sqlite::memory:").await?;
/// let mut tx = store.begin().await?;
/// // ... the business change, through tx.conn() ...
/// tx.enqueue(&Message::to("billing").json(&serde_json::json!({"charge": 42}))?).await?;
/// tx.commit().await?; // the message exists now, and not a moment before
/// assert_eq!(store.admin().stats().await?.pending, 1);
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
#[derive(Clone, Debug)]
pub struct Store {
    pub(crate) backend: Backend,
    pub(crate) config: Arc<StoreConfig>,
    pub(crate) wake: Wakeups,
    pub(crate) lanes: Lanes,
    pub(crate) handover: Slot,
}

/// A write transaction of the store. Dropping it without committing rolls it back.
#[derive(Debug)]
#[must_use = "a transaction that is not committed is rolled back"]
pub struct Tx {
    /// The driver's transaction, with what its lane keeps in it.
    pub(crate) inner: TxOf,
    pub(crate) store: Store,
    pub(crate) enqueued: bool,
    pub(crate) handed: Handed,
    /// The next [`enqueue_batch_after`](Self::enqueue_batch_after) may be deferred.
    pub(crate) defer: bool,
    /// A statement may have failed in this transaction unseen by the store: the
    /// connection was lent out ([`conn`](Self::conn)) or a statement of the store's
    /// failed (its error may have been swallowed). On PostgreSQL such a transaction is
    /// aborted, and its `COMMIT` is answered `ROLLBACK`, which sqlx reports as success:
    /// the commit probes first.
    pub(crate) unchecked: bool,
    /// Something was done in it since [`untouched`](Self::untouched) was last reset: a
    /// statement, a write, a message.
    pub(crate) touched: bool,
}

/// A hop admitted to its lane: the hop, what its inbox record found, the rows its
/// prefetch read.
pub(crate) type Admitted = (Hop, Option<Receipt>, Option<Prefetched>);

/// How a hop gave its transaction back.
pub(crate) enum End {
    /// Keep its effects; tell it whether the transaction committed.
    Commit(oneshot::Sender<Result<()>>),
    /// Undo its effects (dropped, rolled back, or its caller went away).
    Rollback,
}

pub(crate) struct GivenBack {
    pub(crate) tx: Tx,
    pub(crate) end: End,
}

/// The lanes of one store: the queues of the driver's lanes (started on the first
/// hop; the lanes themselves are the driver's tasks), and their counts.
#[derive(Debug, Default, Clone)]
pub(crate) struct Lanes {
    pub(crate) queues: Arc<OnceLock<Vec<mpsc::UnboundedSender<Waiting>>>>,
    pub(crate) counts: Arc<Counts>,
}

/// A hop waiting for its turn in a lane: who asks, the message its hop records in the
/// inbox first (if any), the read it opens with (if any), where its turn goes.
pub(crate) struct Waiting {
    pub(crate) store: Store,
    pub(crate) inbox: Option<(String, MessageId)>,
    pub(crate) prefetch: Option<Prefetch>,
    #[allow(dead_code, reason = "for a driver with a single writer")]
    pub(crate) caller: Caller,
    pub(crate) admitted: oneshot::Sender<Result<Admitted>>,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting").finish_non_exhaustive()
    }
}

/// Hops committed and the commits they took, since the store was opened.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) hops: AtomicU64,
    pub(crate) commits: AtomicU64,
    /// A lane holds the single writer (a batch is running, or it keeps the connection
    /// between two): SQLite's; a driver without a single writer never sets it.
    pub(crate) busy: std::sync::atomic::AtomicBool,
    /// Who holds the single writer through a transaction of the store now (a turn in
    /// the lane, or a transaction of its own), if known: the same caller asking again
    /// would wait for itself ([`Error::NestedTransaction`](crate::Error)).
    pub(crate) holder: std::sync::Mutex<Option<Caller>>,
    /// Signalled when the holder lets go: a caller that found itself the holder (a
    /// future beside the holding one in its task) waits for it.
    pub(crate) released: tokio::sync::Notify,
    /// (feature `testing`) Where a test crashes the store's lane
    /// ([`Store::crash_at_commit`](crate::Store::crash_at_commit)).
    #[cfg(feature = "testing")]
    pub(crate) crash: super::crash_point::Point,
}

/// Who calls: a tokio task, or, outside one (`block_on`, a `#[tokio::main]` function's
/// body), the thread it runs on, which such a future never leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code, reason = "for a driver with a single writer")]
pub(crate) enum Caller {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Caller {
    #[allow(dead_code, reason = "for a driver with a single writer")]
    pub(crate) fn current() -> Self {
        tokio::task::try_id().map_or_else(|| Self::Thread(std::thread::current().id()), Self::Task)
    }
}

/// What group commit has done so far: [`Store::hop_stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HopStats {
    /// Hops committed.
    pub hops: u64,
    /// Shared transactions committed (each holding at least one hop).
    pub commits: u64,
}

/// One hop's turn in a shared transaction (on PostgreSQL, a transaction of its own):
/// use it as the [`Tx`] it derefs to, then [`commit`](Self::commit) it. Dropping it (or
/// [`rollback`](Self::rollback)) undoes this hop's effects only.
#[must_use = "a hop that is not committed is rolled back"]
pub struct Hop {
    pub(crate) tx: Option<Tx>,
    /// Where the shared transaction goes back to; `None` for a transaction of its own.
    pub(crate) back: Option<oneshot::Sender<GivenBack>>,
    pub(crate) counts: Arc<Counts>,
}

impl std::fmt::Debug for Hop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hop").finish_non_exhaustive()
    }
}

/// A handover installed on a store ([`Store::install_handover`](crate::Store::install_handover)):
/// dropped, it removes the handover from the store if it is still the one installed.
#[must_use = "the handover is removed when this is dropped"]
pub struct Installed {
    store: Store,
    handover: Arc<dyn Handover>,
}

impl Installed {
    pub(crate) fn new(store: Store, handover: Arc<dyn Handover>) -> Self {
        Self { store, handover }
    }
}

impl std::fmt::Debug for Installed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Installed")
            .field("owner", &self.handover.owner())
            .finish()
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        self.store.remove_handover(&self.handover);
    }
}
