//! Delivery outcomes waiting to be written: acknowledgements, retries, dead letters
//! and releases, each flushed as one statement per batch.

use agentsaga_core::queue::{DeadLetter, Retry};
use agentsaga_core::{DeliveryFailed, Envelope, RetryPolicy, Store};

use crate::Delivery;
use crate::stats::StatsCell;

/// The reason given when a row comes back with its attempts already spent (relays kept
/// dying while delivering it).
pub(crate) const ATTEMPTS_EXHAUSTED: &str = "attempts exhausted";

/// How the `last_error` of a row waiting for a destination that could not be reached
/// starts (what status, metrics and the console count as waiting for it).
pub(crate) const UNAVAILABLE: &str = "unavailable: ";

/// A delivered row waiting to be marked delivered.
#[derive(Debug)]
pub(crate) struct Ack {
    pub(crate) seq: i64,
    latency_ms: u64,
}

/// Outcomes known to the claimer and not yet in the database. The rows stay leased to
/// this relay meanwhile (their leases are renewed with the in-flight ones).
#[derive(Debug, Default)]
pub(crate) struct Outcomes {
    acks: Vec<Ack>,
    retries: Vec<Retry>,
    dead: Vec<DeadLetter>,
    release: Vec<i64>,
}

impl Outcomes {
    /// Turns a transport's answer into the row's next state.
    pub(crate) fn record(
        &mut self,
        envelope: &Envelope,
        delivery: Delivery,
        finished_ms: i64,
        policy: &RetryPolicy,
    ) {
        match delivery {
            Delivery::Delivered => self.acks.push(Ack {
                seq: envelope.seq,
                latency_ms: u64::try_from(finished_ms - envelope.created_at_ms).unwrap_or(0),
            }),
            Delivery::Retry { reason, .. } if policy.exhausted(envelope.attempts) => {
                self.give_up(envelope, reason);
            }
            Delivery::Retry { reason, after } => self.retries.push(Retry {
                seq: envelope.seq,
                delay: after.unwrap_or_else(|| policy.backoff(envelope.attempts)),
                error: reason,
                spent: true,
            }),
            // However long the way is down: the attempt is given back, nothing dies.
            // Its attempts do not grow, so neither would their backoff: wait as if a few
            // attempts further on (the breaker, when on, paces the probes anyway).
            Delivery::Unavailable { reason, after } => self.retries.push(Retry {
                seq: envelope.seq,
                delay: after.unwrap_or_else(|| policy.backoff(envelope.attempts.saturating_add(4))),
                error: format!("{UNAVAILABLE}{reason}"),
                spent: false,
            }),
            Delivery::Reject { reason } => self.give_up(envelope, reason),
        }
    }

    /// Dead-letters the row, with a `DeliveryFailed` notice to its `reply_to`.
    pub(crate) fn give_up(&mut self, envelope: &Envelope, reason: String) {
        let notice = DeliveryFailed::notice_for(envelope, &reason).unwrap_or_else(|e| {
            tracing::error!(message.id = %envelope.id, error = %e, "cannot build the DeliveryFailed notice");
            None
        });
        tracing::warn!(
            message.id = %envelope.id,
            message.destination = %envelope.destination,
            attempts = envelope.attempts,
            %reason,
            "message dead-lettered"
        );
        self.dead.push(DeadLetter {
            seq: envelope.seq,
            reason,
            notice,
        });
    }

    /// Hands the row back unfinished, its attempt not counted.
    pub(crate) fn release(&mut self, seq: i64) {
        self.release.push(seq);
    }

    /// Takes the acknowledgements out, to be written with the next claim.
    pub(crate) fn take_acks(&mut self) -> Vec<Ack> {
        std::mem::take(&mut self.acks)
    }

    /// Puts back acknowledgements that could not be written.
    pub(crate) fn restore_acks(&mut self, mut acks: Vec<Ack>) {
        acks.append(&mut self.acks);
        self.acks = acks;
    }

    /// Counts acknowledgements written: `n` of them changed a row.
    pub(crate) fn acked(acks: &[Ack], n: u64, stats: &StatsCell) {
        if n < acks.len() as u64 {
            tracing::debug!(
                lost = acks.len() as u64 - n,
                "rows delivered after their lease expired; another relay has them"
            );
        }
        stats.delivered(n);
        for a in acks {
            stats.latency(a.latency_ms);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.acks.is_empty()
            && self.retries.is_empty()
            && self.dead.is_empty()
            && self.release.is_empty()
    }

    /// The rows these outcomes are about (still leased to this relay).
    pub(crate) fn seqs(&self) -> impl Iterator<Item = i64> + '_ {
        self.acks
            .iter()
            .map(|a| a.seq)
            .chain(self.retries.iter().map(|r| r.seq))
            .chain(self.dead.iter().map(|d| d.seq))
            .chain(self.release.iter().copied())
    }

    /// Writes everything, acknowledgements first (they unblock the next row of each
    /// key). A batch that fails stays for the next flush; those before it are cleared.
    pub(crate) async fn flush(
        &mut self,
        store: &Store,
        owner: &str,
        stats: &StatsCell,
    ) -> agentsaga_core::Result<()> {
        if !self.acks.is_empty() {
            let seqs: Vec<i64> = self.acks.iter().map(|a| a.seq).collect();
            let n = store.queue().mark_delivered(owner, &seqs).await?;
            Self::acked(&self.acks, n, stats);
            self.acks.clear();
        }
        if !self.retries.is_empty() {
            let n = store.queue().retry_later(owner, &self.retries).await?;
            stats.retried(n);
            self.retries.clear();
        }
        if !self.dead.is_empty() {
            let n = store.queue().dead_letter(owner, &self.dead).await?;
            stats.dead(n);
            self.dead.clear();
        }
        if !self.release.is_empty() {
            let n = store.queue().release(owner, &self.release).await?;
            stats.released(n);
            self.release.clear();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agentsaga_core::{header, testing};

    use super::*;

    fn envelope(attempts: u32, reply_to: Option<&str>) -> Envelope {
        Envelope {
            attempts,
            created_at_ms: 1_000,
            ..testing::envelope("d", "null", reply_to.map(|r| (header::REPLY_TO, r)))
        }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy::new(Duration::from_millis(10), Duration::from_millis(40), 3)
    }

    #[test]
    fn retries_until_the_budget_is_spent() {
        let mut o = Outcomes::default();
        o.record(&envelope(1, None), Delivery::retry("a"), 0, &policy());
        o.record(
            &envelope(2, None),
            Delivery::retry_after("b", Duration::from_secs(7)),
            0,
            &policy(),
        );
        assert_eq!(o.retries.len(), 2);
        assert!(o.retries[0].delay <= Duration::from_millis(10));
        assert_eq!(o.retries[1].delay, Duration::from_secs(7));
        assert_eq!(o.retries[1].error, "b");
        o.record(
            &envelope(3, Some("orch")),
            Delivery::retry("last"),
            0,
            &policy(),
        );
        assert_eq!(o.dead.len(), 1);
        assert_eq!(o.dead[0].reason, "last");
        let notice = o.dead[0].notice.as_ref().expect("reply_to gets a notice");
        assert_eq!(notice.destination, "orch");
    }

    #[test]
    fn an_unreachable_destination_spends_nothing_and_never_dies() {
        let mut o = Outcomes::default();
        for attempts in [1, 3, 50] {
            o.record(
                &envelope(attempts, Some("orch")),
                Delivery::unavailable("broker away"),
                0,
                &policy(),
            );
        }
        assert!(o.dead.is_empty(), "{:?}", o.dead);
        assert_eq!(o.retries.len(), 3);
        for r in &o.retries {
            assert!(!r.spent);
            assert_eq!(r.error, "unavailable: broker away");
        }
    }

    #[test]
    fn reject_dies_at_once_and_acks_measure_latency() {
        let mut o = Outcomes::default();
        o.record(&envelope(1, None), Delivery::reject("bad"), 0, &policy());
        assert_eq!(o.dead.len(), 1);
        assert!(o.dead[0].notice.is_none());
        o.record(&envelope(1, None), Delivery::Delivered, 1_250, &policy());
        assert_eq!(o.acks[0].latency_ms, 250);
        o.record(&envelope(1, None), Delivery::Delivered, 0, &policy());
        assert_eq!(
            o.acks[1].latency_ms, 0,
            "clock skew is not a negative latency"
        );
        assert_eq!(o.seqs().count(), 3);
    }
}
