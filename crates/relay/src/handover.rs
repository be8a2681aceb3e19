//! The relay's side of direct handover ([`agentsaga_core::handover::Handover`]): slots per
//! destination, and rows committed leased to this relay, adopted by its claimer as if
//! it had claimed them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use agentsaga_core::Envelope;
use agentsaga_core::handover::Handover;
use ractor::ActorRef;

use crate::claimer::msg::ClaimerMsg;

/// What a relay takes directly: for each of its destinations, up to its cap of rows
/// handed over and not yet finished.
pub(crate) struct HandoverSlots {
    owner: String,
    lease: Duration,
    claimer: ActorRef<ClaimerMsg>,
    slots: HashMap<String, Slots>,
    open: AtomicBool,
}

struct Slots {
    used: AtomicUsize,
    cap: usize,
}

impl HandoverSlots {
    pub(crate) fn new(
        owner: String,
        lease: Duration,
        claimer: ActorRef<ClaimerMsg>,
        caps: impl IntoIterator<Item = (String, usize)>,
    ) -> Self {
        Self {
            owner,
            lease,
            claimer,
            slots: caps
                .into_iter()
                .map(|(d, cap)| {
                    let slots = Slots {
                        used: AtomicUsize::new(0),
                        cap,
                    };
                    (d, slots)
                })
                .collect(),
            open: AtomicBool::new(true),
        }
    }

    /// Takes no more (the relay is stopping).
    pub(crate) fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
    }

    /// A handed-over row of `destination` is finished (answered, or released).
    pub(crate) fn done(&self, destination: &str) {
        if let Some(s) = self.slots.get(destination) {
            let _ = s
                .used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
    }
}

impl Handover for HandoverSlots {
    fn owner(&self) -> &str {
        &self.owner
    }

    fn lease(&self) -> Duration {
        self.lease
    }

    fn reserve(&self, destination: &str) -> bool {
        if !self.open.load(Ordering::Acquire) {
            return false;
        }
        let Some(s) = self.slots.get(destination) else {
            return false;
        };
        s.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < s.cap).then_some(n + 1)
            })
            .is_ok()
    }

    fn cancel(&self, destination: &str) {
        self.done(destination);
    }

    fn take(&self, rows: Vec<Envelope>, leased_at: agentsaga_core::clock::Instant) {
        if rows.is_empty() {
            return;
        }
        let destinations: Vec<String> = rows.iter().map(|r| r.destination.clone()).collect();
        if self
            .claimer
            .cast(ClaimerMsg::Adopt(rows, leased_at))
            .is_err()
        {
            // The relay is gone: the rows come back when their leases expire.
            tracing::debug!("handed-over rows not adopted: the relay stopped");
            for d in &destinations {
                self.done(d);
            }
        }
    }
}
