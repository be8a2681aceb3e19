//! The store's handles, declared together because they hold one another: a [`Store`]
//! keeps its lanes, a lane hands out [`Hop`]s, a hop holds a [`Tx`], and a
//! transaction holds its store. What each does is beside its kind: the store in
//! `store.rs`, a transaction in `tx.rs` (and its drivers' sides in `sqlite/tx.rs` and
//! `postgres/tx.rs`), a hop in `hop.rs`, the lanes in `sqlite/lane.rs` and
//! `postgres/sets.rs`.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

#[cfg(feature = "postgres")]
use sqlx::Postgres;
#[cfg(feature = "sqlite")]
use sqlx::Sqlite;
use sqlx::Transaction;
use tokio::sync::{mpsc, oneshot};
#[cfg(feature = "postgres")]
use uuid::Uuid;

use super::backend::Backend;
use super::config::StoreConfig;
use super::conn::Receipt;
use super::handover::{Handed, Handover, Slot};
#[cfg(feature = "sqlite")]
use super::prefetch::Prefetch;
use super::prefetch::Prefetched;
use super::wake::Wakeups;
#[cfg(feature = "postgres")]
use crate::postgres::kept::Kept;
#[cfg(feature = "sqlite")]
use crate::sqlite::{direct::LaneConn, tail::Tail};
use crate::{MessageId, Result};

/// A handle to the database holding the outbox and the inbox. Cheap to clone.
///
/// ```
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
/// ```
#[derive(Clone, Debug)]
pub struct Store {
    pub(crate) backend: Backend,
    pub(crate) config: Arc<StoreConfig>,
    pub(crate) wake: Wakeups,
    pub(crate) lanes: Lanes,
    pub(crate) handover: Slot,
}

#[derive(Debug)]
pub(crate) enum Inner {
    #[cfg(feature = "sqlite")]
    Sqlite(Transaction<'static, Sqlite>),
    /// SQLite's lane: the writer connection, its transactions begun and ended by hand
    /// (statements run on it directly), kept by the lane from one batch to the next.
    #[cfg(feature = "sqlite")]
    Lane(LaneConn),
    #[cfg(feature = "postgres")]
    Postgres(Transaction<'static, Postgres>),
}

/// A write transaction of the store. Dropping it without committing rolls it back.
#[derive(Debug)]
#[must_use = "a transaction that is not committed is rolled back"]
pub struct Tx {
    pub(crate) inner: Inner,
    pub(crate) store: Store,
    pub(crate) enqueued: bool,
    pub(crate) handed: Handed,
    /// The next [`enqueue_batch_after`](Self::enqueue_batch_after) may be deferred.
    pub(crate) defer: bool,
    /// A deferred last write, run by the lane in the round trip that ends the hop.
    #[cfg(feature = "sqlite")]
    pub(crate) tail: Option<Tail>,
    /// PostgreSQL's set lane: what its hops keep as data, written at the batch's end.
    #[cfg(feature = "postgres")]
    pub(crate) sets: Option<Kept>,
    /// A statement may have failed in this transaction unseen by the store: the
    /// connection was lent out ([`conn`](Self::conn)) or a statement of the store's
    /// failed (its error may have been swallowed). On PostgreSQL such a transaction is
    /// aborted, and its `COMMIT` is answered `ROLLBACK`, which sqlx reports as success:
    /// the commit probes first.
    pub(crate) unchecked: bool,
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

/// The lanes of one store: created on the first hop.
#[derive(Debug, Default, Clone)]
pub(crate) struct Lanes {
    /// SQLite's lane.
    #[cfg(feature = "sqlite")]
    pub(crate) sqlite: Arc<OnceLock<mpsc::UnboundedSender<LaneRequest>>>,
    /// PostgreSQL's set lanes.
    #[cfg(feature = "postgres")]
    pub(crate) sets: Arc<OnceLock<Vec<mpsc::UnboundedSender<SetRequest>>>>,
    pub(crate) counts: Arc<Counts>,
}

/// Hops committed and the commits they took, since the store was opened.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) hops: AtomicU64,
    pub(crate) commits: AtomicU64,
    /// SQLite's lane holds the writer (a batch is running, or it keeps the connection
    /// between two).
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) busy: std::sync::atomic::AtomicBool,
    /// Who holds SQLite's writer through a transaction of the store now (a turn in the
    /// lane, or a transaction of its own), if known: the same caller asking again would
    /// wait for itself ([`Error::NestedTransaction`](crate::Error)).
    #[cfg(feature = "sqlite")]
    pub(crate) holder: std::sync::Mutex<Option<Caller>>,
    /// Signalled when the holder lets go: a caller that found itself the holder (a
    /// future beside the holding one in its task) waits for it.
    #[cfg(feature = "sqlite")]
    pub(crate) released: tokio::sync::Notify,
}

/// Who calls: a tokio task, or, outside one (`block_on`, a `#[tokio::main]` function's
/// body), the thread it runs on, which such a future never leaves.
#[cfg(feature = "sqlite")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

#[cfg(feature = "sqlite")]
impl Caller {
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

/// A caller waiting for its turn in SQLite's lane.
#[cfg(feature = "sqlite")]
pub(crate) struct LaneRequest {
    pub(crate) store: Store,
    /// The message the hop records in the inbox first, if any.
    pub(crate) inbox: Option<(String, MessageId)>,
    /// The read the hop starts with, if any (SQLite).
    pub(crate) prefetch: Option<Prefetch>,
    /// Who asked.
    pub(crate) caller: Caller,
    pub(crate) admitted: oneshot::Sender<Result<Admitted>>,
}

#[cfg(feature = "sqlite")]
impl std::fmt::Debug for LaneRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LaneRequest")
    }
}

/// A hop waiting for the set lane.
#[cfg(feature = "postgres")]
pub(crate) struct SetRequest {
    pub(crate) store: Store,
    pub(crate) consumer: String,
    pub(crate) id: MessageId,
    /// The prefetch's key and set statements.
    pub(crate) key: Uuid,
    pub(crate) statements: &'static [&'static str],
    pub(crate) admitted: oneshot::Sender<Result<Admitted>>,
}

#[cfg(feature = "postgres")]
impl std::fmt::Debug for SetRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SetRequest")
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
