//! What a [`NatsReceiver`](super::NatsReceiver) has done so far.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of a receiver's counters ([`NatsReceiver::stats`](super::NatsReceiver::stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReceiverStats {
    /// Messages fetched from the stream (redeliveries included).
    pub received: u64,
    /// Messages in committed batches, enqueued or found already stored.
    pub stored: u64,
    /// Of those, messages the server delivered more than once (a redelivery; the
    /// store keeps one).
    pub redelivered: u64,
    /// Messages written to the dead letters (bad input).
    pub dead_lettered: u64,
    /// Batches committed.
    pub batches: u64,
    /// Messages handed back to the server (`-NAK`) because the store failed.
    pub naks: u64,
    /// Acknowledgements not confirmed after a commit: those messages come back, and
    /// are found stored.
    pub ack_failures: u64,
    /// Times the consumer's session failed (the server away, a request refused) and
    /// was set up again after a backoff.
    pub reconnects: u64,
    /// Fetches that ended before the server ended them (nothing came for `ack_wait`:
    /// a slow or cut link): what came was stored, and the receiver waited out
    /// `ack_wait` for the rest to come back before it fetched again.
    pub cut_fetches: u64,
    /// Destinations this receiver holds now: it consumes them. Of the processes of
    /// one service sharing a database, one at a time holds a destination; the others
    /// stand by (holding none of it) and take over when it goes.
    pub holding: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) received: AtomicU64,
    pub(crate) stored: AtomicU64,
    pub(crate) redelivered: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) naks: AtomicU64,
    pub(crate) ack_failures: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) cut_fetches: AtomicU64,
    pub(crate) holding: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ReceiverStats {
        ReceiverStats {
            received: self.received.load(Relaxed),
            stored: self.stored.load(Relaxed),
            redelivered: self.redelivered.load(Relaxed),
            dead_lettered: self.dead_lettered.load(Relaxed),
            batches: self.batches.load(Relaxed),
            naks: self.naks.load(Relaxed),
            ack_failures: self.ack_failures.load(Relaxed),
            reconnects: self.reconnects.load(Relaxed),
            cut_fetches: self.cut_fetches.load(Relaxed),
            holding: self.holding.load(Relaxed),
        }
    }
}
