//! The stall watch: finds stalled sagas (running or compensating, not parked at a
//! wait, with nothing pending or in flight for any of their steps, or no progress for
//! longer than a threshold: [`agentsaga_saga::query::stalled`]) every so often, logs a
//! warning once per stalled saga, and keeps the `agentsaga_sagas_stalled` gauge (and
//! the `agentsaga_stalled_warnings_total` counter) current.

use std::collections::HashSet;
use std::time::Duration;

use agentsaga_core::Store;
use agentsaga_saga::{SagaId, query};
use tokio::task::JoinHandle;

/// How often, and past what threshold, the watch looks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StallWatch {
    pub(crate) threshold: Duration,
    pub(crate) every: Duration,
}

impl Default for StallWatch {
    fn default() -> Self {
        Self {
            threshold: Duration::from_secs(15 * 60),
            every: Duration::from_secs(30),
        }
    }
}

/// The most stalled sagas one look reports (and remembers as warned).
const MAX_REPORTED: u32 = 1000;

pub(crate) fn spawn(store: Store, watch: StallWatch) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut warned: HashSet<SagaId> = HashSet::new();
        let mut tick = tokio::time::interval(watch.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            look(&store, watch.threshold, &mut warned).await;
        }
    })
}

/// One look: warns of the sagas newly stalled, forgets those no longer stalled.
async fn look(store: &Store, threshold: Duration, warned: &mut HashSet<SagaId>) {
    let stalled = match query::stalled(store, threshold, MAX_REPORTED).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, "stall watch: query failed");
            return;
        }
    };
    metrics::gauge!("agentsaga_sagas_stalled").set(stalled.len() as f64);
    let now: HashSet<SagaId> = stalled.iter().map(|s| s.id).collect();
    for s in &stalled {
        if warned.insert(s.id) {
            metrics::counter!("agentsaga_stalled_warnings_total").increment(1);
            tracing::warn!(
                saga.id = %s.id,
                saga.name = %s.name,
                state = %s.state,
                updated_at_ms = s.updated_at_ms,
                "saga stalled: nothing is pending or in flight for it, or it made no progress \
                 for {threshold:?}; see `agentsaga sagas show {}`",
                s.id
            );
        }
    }
    warned.retain(|id| now.contains(id));
}
