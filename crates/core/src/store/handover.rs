//! Direct handover: a message for a destination this process serves goes from the
//! transaction that wrote it straight to its consumer, with no claim.
//!
//! A relay that serves destinations in this process installs a [`Handover`] on the
//! store. A [`Tx`](super::Tx) then writes each message that is ready now, whose
//! destination has a free slot, and whose key has no live row, already *leased* to that
//! relay (`in_flight`, its first attempt), and after the commit hands the rows to the
//! relay as if it had claimed them. Everything else about the row is as for a claimed
//! one: the relay renews its lease while it is delivered, acknowledges, retries or
//! dead-letters it. If the process dies, or the handover is lost, the lease expires and
//! the row returns to `pending` for any relay: the claim is the safety net.
//!
//! Slots bound what is handed over and not yet finished, per destination: a burst of
//! messages beyond them stays `pending` in the outbox, not in memory.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use crate::clock::Instant;

use crate::Envelope;

/// What a relay offers to take directly. See the module docs.
pub trait Handover: Send + Sync + 'static {
    /// The lease owner handed-over rows are written with (the relay's owner id).
    fn owner(&self) -> &str;
    /// Their lease.
    fn lease(&self) -> Duration;
    /// Takes a slot for one message to `destination`: `true` if it will be handed over.
    fn reserve(&self, destination: &str) -> bool;
    /// Gives back a slot whose message was not handed over after all (its row was not
    /// written leased, or its transaction did not commit).
    fn cancel(&self, destination: &str);
    /// Rows written leased to [`owner`](Self::owner), now committed: deliver them.
    ///
    /// Their leases began when they were written (`leased_at`, or later), not at the
    /// commit: a transaction left open longer than the lease commits rows another relay
    /// may claim at once. The taker's fence must count from `leased_at`, and a row whose
    /// lease has run out by now must not be delivered by it (the claim takes it).
    fn take(&self, rows: Vec<Envelope>, leased_at: Instant);
}

/// The handover installed on a store, shared by its clones.
#[derive(Clone, Default)]
pub(crate) struct Slot(Arc<RwLock<Option<Arc<dyn Handover>>>>);

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

impl Slot {
    pub(crate) fn get(&self) -> Option<Arc<dyn Handover>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set(&self, handover: Option<Arc<dyn Handover>>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = handover;
    }

    /// Removes `handover` if it is the one installed.
    pub(crate) fn remove(&self, handover: &Arc<dyn Handover>) {
        let mut slot = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|h| Arc::ptr_eq(h, handover)) {
            *slot = None;
        }
    }
}

/// The rows a transaction wrote leased, waiting for its commit. Dropped without
/// [`commit`](Self::commit), it gives their slots back.
#[derive(Default)]
pub(crate) struct Handed {
    rows: Vec<(Arc<dyn Handover>, Envelope)>,
    /// When the first of them was written leased (at or before its lease began).
    leased_at: Option<Instant>,
}

impl std::fmt::Debug for Handed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handed")
            .field("rows", &self.rows.len())
            .finish()
    }
}

impl Handed {
    /// A row written leased; its lease began at `leased_at` or later.
    pub(crate) fn push(&mut self, to: Arc<dyn Handover>, row: Envelope, leased_at: Instant) {
        self.rows.push((to, row));
        self.leased_at = Some(self.leased_at.map_or(leased_at, |at| at.min(leased_at)));
    }

    /// How many rows so far: a mark to [`cancel_since`](Self::cancel_since).
    pub(crate) fn mark(&self) -> usize {
        self.rows.len()
    }

    /// Forgets the rows written since `mark` (their savepoint was rolled back).
    pub(crate) fn cancel_since(&mut self, mark: usize) {
        for (to, row) in self.rows.drain(mark.min(self.rows.len())..) {
            to.cancel(&row.destination);
        }
    }

    /// The transaction committed: hand the rows over.
    pub(crate) fn commit(&mut self) {
        let rows = std::mem::take(&mut self.rows);
        let (Some(leased_at), Some((first, _))) = (self.leased_at.take(), rows.first()) else {
            return;
        };
        let to = Arc::clone(first);
        // One store has one handover at a time; rows written under another (replaced
        // meanwhile) go to theirs.
        let (mine, others): (Vec<_>, Vec<_>) =
            rows.into_iter().partition(|(h, _)| Arc::ptr_eq(h, &to));
        to.take(mine.into_iter().map(|(_, row)| row).collect(), leased_at);
        for (h, row) in others {
            h.take(vec![row], leased_at);
        }
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        self.cancel_since(0);
    }
}
