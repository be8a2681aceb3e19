//! Claiming: rows up to the in-flight window (with the acknowledgements of the last
//! flush in the same call when the backend can), and their dispatch to the pool.

use std::sync::Arc;

use agentsaga_core::Envelope;
use agentsaga_core::queue::Claim;
use ractor::ActorRef;
use tokio::time::Instant;

use super::{Claimer, ClaimerMsg, ClaimerState, held_for};
use crate::breaker::Claimable;
use crate::outcomes::{ATTEMPTS_EXHAUSTED, Ack, Outcomes};
use crate::pacer::Signal;
use crate::worker::RouteKey;

impl Claimer {
    /// Claims rows up to the in-flight window and dispatches them.
    pub(super) async fn claim(&self, myself: &ActorRef<ClaimerMsg>, state: &mut ClaimerState) {
        self.claim_acking(myself, state, Vec::new()).await;
    }

    /// Writes `acks` and claims rows up to the in-flight window, in one call when it
    /// can, and dispatches them.
    pub(super) async fn claim_acking(
        &self,
        myself: &ActorRef<ClaimerMsg>,
        state: &mut ClaimerState,
        acks: Vec<Ack>,
    ) {
        // The backoff after a failed claim guards the database: real time. What is
        // leased, paused or due: the store's clock.
        if !state.claim_backoff.remaining(Instant::now()).is_zero() {
            // The failure that set the backoff scheduled a Tick; the acks go alone.
            self.write_acks(myself, state, acks).await;
            return;
        }
        // The window: every worker busy plus a full batch queued in the pool behind
        // them. Claiming only for idle workers made each claim a handful of rows and
        // each ack smaller still (one statement per few rows); queued rows are leased
        // and renewed like the ones being delivered, and per-key order is the claim's
        // business (one row per key in flight), not the pool's.
        let window = self.config.workers + self.config.batch_size as usize;
        let free = window.saturating_sub(state.delivering.len());
        if free == 0 {
            self.write_acks(myself, state, acks).await;
            return;
        }
        let limit = u32::try_from(free)
            .unwrap_or(u32::MAX)
            .min(self.config.batch_size);
        let now = self.store.clock().now();
        let Claimable { mut closed, probe } = state.breakers.claimable(&self.destinations, now);
        // A destination at its in-flight cap sits this claim out.
        closed.retain(|d| {
            self.config
                .destination_limits
                .get(d)
                .is_none_or(|&cap| state.delivering.count(d) < cap)
        });
        let mut claimed = Vec::new();
        let mut error = None;
        let mut full = false;
        if closed.is_empty() {
            self.write_acks(myself, state, acks).await;
        } else {
            let seqs: Vec<i64> = acks.iter().map(|a| a.seq).collect();
            match self
                .store
                .queue()
                .ack_and_claim(&seqs, &self.claim_of(&closed, limit))
                .await
            {
                Ok((acked, rows)) => {
                    Outcomes::acked(&acks, acked, &self.stats);
                    full = rows.len() == limit as usize;
                    claimed.extend(rows.into_iter().map(|e| (e, false)));
                }
                Err(e) => {
                    // Neither happened: the acks wait for the retry below.
                    state.outcomes.restore_acks(acks);
                    error = Some(e);
                }
            }
        }
        // A half-open destination gets a single probe row.
        for destination in &probe {
            if error.is_some() || claimed.len() >= free {
                break;
            }
            let one = std::slice::from_ref(destination);
            match self.store.queue().claim(&self.claim_of(one, 1)).await {
                Ok(rows) => {
                    if !rows.is_empty() {
                        state.breakers.probing(destination, true);
                    }
                    claimed.extend(rows.into_iter().map(|e| (e, true)));
                }
                Err(e) => error = Some(e),
            }
        }
        let count = claimed.len();
        // Fenced from now, the claims answered: their leases began before.
        let held_until = self.store.clock().lease_now() + held_for(self.config.lease);
        for (envelope, probe) in claimed {
            self.dispatch(myself, state, envelope, probe, held_until);
        }
        self.stats.set_in_flight(state.delivering.len());
        if let Some(e) = error {
            let delay = self.db_failed("claiming rows", &e, &mut state.claim_backoff);
            myself.send_after(delay, || ClaimerMsg::Tick);
            if !state.outcomes.is_empty() && !state.flush_queued {
                state.flush_queued = true;
                myself.send_after(delay, || ClaimerMsg::Flush);
            }
        } else {
            state.claim_backoff.reset();
            if full && count < free {
                // A full batch and room for more: there may be more ready rows.
                state.signals.post(myself, Signal::Tick);
            }
        }
    }

    /// Writes acknowledgements on their own (no claim to carry them).
    pub(super) async fn write_acks(
        &self,
        myself: &ActorRef<ClaimerMsg>,
        state: &mut ClaimerState,
        acks: Vec<Ack>,
    ) {
        if !acks.is_empty() {
            state.outcomes.restore_acks(acks);
            self.flush(myself, state).await;
        }
    }

    pub(super) fn claim_of<'a>(&'a self, destinations: &'a [String], limit: u32) -> Claim<'a> {
        Claim {
            owner: &self.config.owner,
            destinations,
            limit,
            lease: self.config.lease,
        }
    }

    pub(super) fn dispatch(
        &self,
        myself: &ActorRef<ClaimerMsg>,
        state: &mut ClaimerState,
        envelope: Envelope,
        probe: bool,
        held_until: Instant,
    ) {
        if envelope.attempts > self.config.retry.max_attempts {
            // Claimed more often than the budget allows: relays died delivering it
            // (e.g. it crashes whatever handles it). Do not try again.
            if probe {
                state.breakers.probing(&envelope.destination, false);
            }
            state
                .outcomes
                .give_up(&envelope, ATTEMPTS_EXHAUSTED.to_owned());
            self.queue_flush(myself, state);
            return;
        }
        let envelope = Arc::new(envelope);
        let seq = envelope.seq;
        let task = state.delivering.insert(Arc::clone(&envelope), held_until);
        match state.pool.dispatch(RouteKey::of(&envelope), task) {
            Ok(()) => {}
            Err(e) => {
                state.delivering.undo(seq);
                tracing::warn!(seq, error = %e, "relay delivery pool unavailable; releasing the row");
                if probe {
                    state.breakers.probing(&envelope.destination, false);
                }
                state.outcomes.release(seq);
                self.queue_flush(myself, state);
            }
        }
    }
}
