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

    pub(super) async fn renew(&self, state: &mut ClaimerState) {
        let seqs: Vec<i64> = state
            .delivering
            .seqs()
            .chain(state.outcomes.seqs())
            .collect();
        if seqs.is_empty() {
            return;
        }
        if let Err(e) = self
            .store
            .queue()
            .renew_leases(&self.config.owner, &seqs, self.config.lease)
            .await
        {
            self.stats.db_error();
            tracing::warn!(error = %e, rows = seqs.len(), "relay could not renew its leases");
        }
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
