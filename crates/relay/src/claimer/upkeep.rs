//! Upkeep of what this relay holds: writing outcomes back, renewing leases, and
//! returning the expired leases of dead relays to the pool.

use ractor::ActorRef;
use tokio::time::Instant;

use super::{Claimer, ClaimerMsg, ClaimerState};

impl Claimer {
    /// Writes the collected outcomes; on failure keeps them and tries again later.
    pub(super) async fn flush(&self, myself: &ActorRef<ClaimerMsg>, state: &mut ClaimerState) {
        if state.outcomes.is_empty() {
            return;
        }
        let wait = state.flush_backoff.remaining(Instant::now());
        if !wait.is_zero() {
            state.flush_queued = true;
            myself.send_after(wait, || ClaimerMsg::Flush);
            return;
        }
        match state
            .outcomes
            .flush(&self.store, &self.config.owner, &self.stats)
            .await
        {
            Ok(()) => state.flush_backoff.reset(),
            Err(e) => {
                let delay =
                    self.db_failed("writing delivery outcomes", &e, &mut state.flush_backoff);
                state.flush_queued = true;
                myself.send_after(delay, || ClaimerMsg::Flush);
            }
        }
    }

    /// Renews the leases of the rows being delivered (and of those whose outcome waits
    /// to be written). A row whose lease was not renewed is not this relay's any more:
    /// its delivery is cancelled, and its outcome will not be written. If renewing
    /// fails, the deliveries whose leases may have run out meanwhile are cancelled.
    pub(super) async fn renew(&self, state: &mut ClaimerState) {
        let delivering: Vec<i64> = state.delivering.seqs().collect();
        let seqs: Vec<i64> = delivering
            .iter()
            .copied()
            .chain(state.outcomes.seqs())
            .collect();
        if seqs.is_empty() {
            return;
        }
        let asked = self.store.clock().lease_now();
        match self
            .store
            .queue()
            .renew_leases(&self.config.owner, &seqs, self.config.lease)
            .await
        {
            Ok(renewed) => {
                let held_until = asked + super::held_for(self.config.lease);
                let lost = state.delivering.renewed(&delivering, &renewed, held_until);
                if lost > 0 {
                    self.stats.leases_lost(lost);
                    tracing::warn!(
                        rows = lost,
                        "relay lost leases of rows it was delivering (expired and taken \
                         over): their deliveries are cancelled"
                    );
                }
            }
            Err(e) => {
                self.stats.db_error();
                tracing::warn!(error = %e, rows = seqs.len(), "relay could not renew its leases");
                let lost = state.delivering.expire(self.store.clock().lease_now());
                if lost > 0 {
                    self.stats.leases_lost(lost);
                    tracing::warn!(
                        rows = lost,
                        "relay could not renew leases before they ran out: their \
                         deliveries are cancelled"
                    );
                }
            }
        }
        self.stats.set_in_flight(state.delivering.len());
    }

    pub(super) async fn reclaim(&self, myself: &ActorRef<ClaimerMsg>, state: &mut ClaimerState) {
        match self.store.queue().reclaim_expired().await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(rows = n, "rows with expired leases returned to the pool");
                self.claim(myself, state).await;
            }
            Err(e) => {
                self.stats.db_error();
                tracing::warn!(error = %e, "relay could not reclaim expired leases");
            }
        }
    }
}
