//! Wakeups: an enqueue committed in this process wakes its relays at once; a driver
//! whose database is shared (PostgreSQL, see `postgres::notify`) also passes them on
//! to the relays of other processes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::{Notify, watch};

/// A wakeup signal relays wait on. Cloning shares it.
#[derive(Clone, Debug)]
pub struct Wakeups {
    tx: Arc<watch::Sender<u64>>,
    remote: Option<Arc<Remote>>,
}

/// What a wake tells the driver's task that passes wakes on to other processes.
#[derive(Debug)]
#[allow(
    dead_code,
    reason = "built by `with_remote()` only, for a driver whose database is shared"
)]
pub(crate) struct Remote {
    /// A wake happened since the task last passed one on.
    pub(crate) dirty: AtomicBool,
    /// Wakes the task.
    pub(crate) kick: Notify,
}

impl Wakeups {
    #[allow(
        dead_code,
        reason = "for a driver whose relays are all in this process"
    )]
    pub(crate) fn local() -> Self {
        Self {
            tx: Arc::new(watch::channel(0).0),
            remote: None,
        }
    }

    /// Wakeups that also reach other processes: `remote` is told of every wake, for
    /// a driver's task to pass on (see `postgres::notify`), and `tx` is the sender
    /// that driver's listener wakes this process's relays through.
    #[allow(dead_code, reason = "for a driver whose database is shared")]
    pub(crate) fn with_remote() -> (Self, Arc<Remote>) {
        let remote = Arc::new(Remote {
            dirty: AtomicBool::new(false),
            kick: Notify::new(),
        });
        let this = Self {
            tx: Arc::new(watch::channel(0).0),
            remote: Some(Arc::clone(&remote)),
        };
        (this, remote)
    }

    /// The sender of the wakeups, held weakly (a driver's listener stops once the
    /// store is gone).
    #[allow(dead_code, reason = "for a driver whose database is shared")]
    pub(crate) fn sender(&self) -> std::sync::Weak<watch::Sender<u64>> {
        Arc::downgrade(&self.tx)
    }

    /// Signals that new messages were committed.
    pub fn wake(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
        if let Some(remote) = &self.remote {
            remote.dirty.store(true, Ordering::Release);
            remote.kick.notify_one();
        }
    }

    /// A receiver that changes on every wakeup (local, or NOTIFY from elsewhere).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}
