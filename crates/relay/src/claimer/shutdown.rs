//! Graceful shutdown: stop claiming, let deliveries in flight finish (up to
//! `shutdown_timeout`), write their outcomes, release what is unfinished, stop.

use ractor::{ActorRef, RpcReplyPort};

use super::{Claimer, ClaimerMsg, ClaimerState, Stop};

impl Claimer {
    pub(super) async fn begin_shutdown(
        &self,
        myself: &ActorRef<ClaimerMsg>,
        state: &mut ClaimerState,
        reply: Option<RpcReplyPort<()>>,
    ) {
        match &mut state.stop {
            Stop::Running => {}
            Stop::Draining(waiters) => {
                waiters.extend(reply);
                return;
            }
            Stop::Stopped => {
                if let Some(reply) = reply {
                    let _ = reply.send(());
                }
                return;
            }
        }
        // No more claims from here on (the pacer keeps running so that leases of rows
        // still being delivered are renewed while we wait), and no more handovers.
        state.stop = Stop::Draining(reply.into_iter().collect());
        state.delivering.stop_handover();
        tracing::info!(
            owner = %self.config.owner,
            in_flight = state.delivering.len(),
            "relay shutting down"
        );
        if state.delivering.is_empty() {
            self.finish(myself, state).await;
        } else {
            myself.send_after(self.config.shutdown_timeout, || {
                ClaimerMsg::ShutdownDeadline
            });
        }
    }

    /// The last step: one final flush, unfinished rows released, actors stopped.
    pub(super) async fn finish(&self, myself: &ActorRef<ClaimerMsg>, state: &mut ClaimerState) {
        let waiters = match std::mem::replace(&mut state.stop, Stop::Stopped) {
            Stop::Draining(waiters) => waiters,
            Stop::Running | Stop::Stopped => Vec::new(),
        };
        if let Some(pacer) = state.pacer.take() {
            pacer.abort();
        }
        // Released rows go back to pending with their attempt uncounted; a delivery that
        // is still running may yet reach its destination, which the consumer's inbox
        // absorbs when the row is delivered again.
        let unfinished: Vec<i64> = state.delivering.drain();
        for seq in unfinished {
            state.outcomes.release(seq);
        }
        self.stats.set_in_flight(0);
        if let Err(e) = state
            .outcomes
            .flush(&self.store, &self.config.owner, &self.stats)
            .await
        {
            self.stats.db_error();
            tracing::warn!(
                error = %e,
                "relay could not write its final outcomes; those rows return to the pool when \
                 their leases expire"
            );
        }
        // Kill, not stop: a worker blocked in a delivery must not hold up the shutdown
        // (its transport task is aborted with it).
        state.pool.kill();
        tracing::info!(owner = %self.config.owner, "relay stopped");
        for waiter in waiters {
            let _ = waiter.send(());
        }
        myself.stop(Some("relay shut down".to_owned()));
    }
}
