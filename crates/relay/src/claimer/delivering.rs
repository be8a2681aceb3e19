//! The rows a claimer has handed to its delivery pool and not yet heard back about:
//! each delivery numbered (a row claimed again is another delivery, and fences the
//! first), its lease's local deadline, its cancel signal, and the handover's slots.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use agentsaga_core::Envelope;
use tokio::time::Instant;

use crate::handover::HandoverSlots;
use crate::worker::Task;

/// Rows handed to the pool and not yet reported back, counted per destination (for
/// [`RelayConfig::destination_limits`](crate::RelayConfig::destination_limits)).
#[derive(Default)]
pub(crate) struct Delivering {
    rows: HashMap<i64, Entry>,
    /// The number of the next delivery.
    next: u64,
    per_destination: HashMap<String, usize>,
    /// Direct handover, if on: its slots are given back as handed-over rows finish.
    pub(super) handover: Option<Arc<HandoverSlots>>,
    /// `handover`, installed on the store: dropped (at the stop), it is removed.
    pub(super) installed: Option<agentsaga_core::handover::Installed>,
    /// The rows of these that were handed over (not claimed).
    handed: HashSet<i64>,
}

/// A row being delivered: its delivery's number, the signal that cancels it, and until
/// when this relay surely holds its lease.
struct Entry {
    envelope: Arc<Envelope>,
    number: u64,
    lost: tokio::sync::watch::Sender<bool>,
    /// Local time by which the lease surely still holds: [`held_for`] the lease from
    /// when its claim or handover was taken in, or from before its last renewal. The
    /// delivery sees it too, as its [`Lease`](crate::lease::Lease).
    held_until: tokio::sync::watch::Sender<Instant>,
}

impl Delivering {
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Rows of `destination` in flight.
    pub(crate) fn count(&self, destination: &str) -> usize {
        self.per_destination.get(destination).copied().unwrap_or(0)
    }

    pub(crate) fn seqs(&self) -> impl Iterator<Item = i64> + '_ {
        self.rows.keys().copied()
    }

    /// A new delivery of `envelope`, held until `held_until`: its task for the pool.
    pub(super) fn insert(&mut self, envelope: Arc<Envelope>, held_until: Instant) -> Arc<Task> {
        *self
            .per_destination
            .entry(envelope.destination.clone())
            .or_default() += 1;
        self.next += 1;
        let (lost, watch) = tokio::sync::watch::channel(false);
        let (held_until, lease) = tokio::sync::watch::channel(held_until);
        let task = Arc::new(Task {
            envelope: Arc::clone(&envelope),
            delivery: self.next,
            lost: watch,
            lease: crate::lease::Lease::new(lease),
        });
        let entry = Entry {
            envelope,
            number: self.next,
            lost,
            held_until,
        };
        if let Some(old) = self.rows.insert(entry.envelope.seq, entry) {
            // Claimed again (its lease expired and it came back): the old delivery
            // is not the row's any more.
            let _ = old.lost.send(true);
            self.forget(&old.envelope.destination);
        }
        task
    }

    /// Forgets a dispatch that did not happen.
    pub(super) fn undo(&mut self, seq: i64) {
        self.remove(seq, None);
    }

    /// The row of delivery `number` (any, if `None`), if it is still this relay's.
    pub(super) fn remove(&mut self, seq: i64, number: Option<u64>) -> Option<Arc<Envelope>> {
        if number.is_some_and(|n| self.rows.get(&seq).is_none_or(|e| e.number != n)) {
            return None;
        }
        let entry = self.rows.remove(&seq)?;
        self.forget(&entry.envelope.destination);
        self.unhand(seq, &entry.envelope.destination);
        Some(entry.envelope)
    }

    /// The leases of `renewed` hold until `held_until`; every other row of `asked` is
    /// not this relay's any more (its lease expired and another took it, or it was
    /// reclaimed): its delivery is cancelled and forgotten. Returns how many.
    pub(super) fn renewed(&mut self, asked: &[i64], renewed: &[i64], held_until: Instant) -> usize {
        let renewed: HashSet<i64> = renewed.iter().copied().collect();
        let mut lost = Vec::new();
        for seq in asked {
            match self.rows.get_mut(seq) {
                Some(e) if renewed.contains(seq) => {
                    e.held_until.send_replace(held_until);
                }
                Some(_) => lost.push(*seq),
                None => {}
            }
        }
        self.lose(&lost)
    }

    /// Cancels and forgets the deliveries whose lease may have run out by `now` (the
    /// renewals failed meanwhile). Returns how many.
    pub(super) fn expire(&mut self, now: Instant) -> usize {
        let lost: Vec<i64> = self
            .rows
            .iter()
            .filter(|(_, e)| *e.held_until.borrow() <= now)
            .map(|(seq, _)| *seq)
            .collect();
        self.lose(&lost)
    }

    pub(super) fn lose(&mut self, seqs: &[i64]) -> usize {
        for &seq in seqs {
            if let Some(e) = self.rows.get(&seq) {
                let _ = e.lost.send(true);
            }
            self.remove(seq, None);
        }
        seqs.len()
    }

    /// Marks `seq`, being delivered, as handed over (not claimed); false if it is not
    /// being delivered (it was released instead).
    pub(super) fn mark_handed(&mut self, seq: i64) -> bool {
        let delivering = self.rows.contains_key(&seq);
        if delivering {
            self.handed.insert(seq);
        }
        delivering
    }

    /// Gives back the handover slot of `seq`, if it was handed over.
    pub(super) fn unhand(&mut self, seq: i64, destination: &str) {
        if self.handed.remove(&seq)
            && let Some(h) = &self.handover
        {
            h.done(destination);
        }
    }

    /// Takes no more handed-over rows, and removes the handover from its store.
    pub(crate) fn stop_handover(&mut self) {
        if let Some(h) = &self.handover {
            h.close();
        }
        self.installed = None;
    }

    pub(super) fn forget(&mut self, destination: &str) {
        if let Some(n) = self.per_destination.get_mut(destination) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_destination.remove(destination);
            }
        }
    }

    /// Empties it, returning the rows' seqs.
    pub(crate) fn drain(&mut self) -> Vec<i64> {
        self.per_destination.clear();
        let rows: Vec<_> = self.rows.drain().collect();
        for (seq, entry) in &rows {
            self.unhand(*seq, &entry.envelope.destination);
        }
        rows.into_iter().map(|(seq, _)| seq).collect()
    }
}

/// How long after its claim (or renewal) was answered a lease surely still holds: the
/// lease less a tenth, for the round trip of the claim. A row handed over is fenced from
/// the instant before its insert (where its lease began), not from its commit: see
/// `Claimer::adopt`.
pub(crate) fn held_for(lease: std::time::Duration) -> std::time::Duration {
    lease - lease / 10
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(seq: i64) -> Arc<Envelope> {
        Arc::new(Envelope {
            seq,
            id: agentsaga_core::MessageId::new(),
            destination: "d".into(),
            key: None,
            payload: "null".into(),
            headers: Default::default(),
            attempts: 1,
            created_at_ms: 0,
        })
    }

    // A row claimed again by the same relay is another delivery: the old one is told
    // it lost the row, and its outcome does not decide the new one's.
    #[test]
    fn a_second_delivery_of_a_row_fences_the_first() {
        let mut d = Delivering::default();
        let later = Instant::now() + std::time::Duration::from_secs(60);
        let first = d.insert(envelope(7), later);
        assert!(!*first.lost.borrow());
        let second = d.insert(envelope(7), later);
        assert!(*first.lost.borrow(), "the first delivery is told");
        assert!(!*second.lost.borrow());
        assert_eq!(d.len(), 1);
        assert_eq!(d.count("d"), 1);
        assert!(
            d.remove(7, Some(first.delivery)).is_none(),
            "a stale outcome"
        );
        assert_eq!(d.len(), 1);
        assert!(d.remove(7, Some(second.delivery)).is_some());
        assert!(d.is_empty());
    }

    // Renewal: rows not renewed are lost (cancelled, forgotten); with renewals failing,
    // rows past their local deadline are.
    #[test]
    fn rows_not_renewed_are_lost() {
        let mut d = Delivering::default();
        let now = Instant::now();
        let a = d.insert(envelope(1), now + std::time::Duration::from_secs(60));
        let b = d.insert(envelope(2), now + std::time::Duration::from_secs(60));
        assert_eq!(
            d.renewed(&[1, 2], &[1], now + std::time::Duration::from_secs(30)),
            1
        );
        assert!(!*a.lost.borrow());
        assert!(*b.lost.borrow());
        assert_eq!(d.len(), 1);
        assert_eq!(d.expire(now + std::time::Duration::from_secs(29)), 0);
        assert_eq!(d.expire(now + std::time::Duration::from_secs(31)), 1);
        assert!(*a.lost.borrow());
        assert!(d.is_empty());
    }
}
