//! The stall watch: finds stalled sagas (running or compensating, not parked at a
//! wait, with nothing pending or in flight for any of their steps, or no progress for
//! longer than a threshold: [`agentsaga_saga::query::stalled`]) every so often, logs a
//! warning once per stalled saga, and keeps the `agentsaga_sagas_stalled` gauge (and
//! the `agentsaga_stalled_warnings_total` counter) current.
//!
//! A saga whose live step is at a destination served by another service (feature
//! `nats`: [`RuntimeBuilder::remote`](crate::RuntimeBuilder::remote)) has nothing
//! pending here while the other service works on it: it counts as stalled only past
//! the threshold.

use std::collections::HashSet;
use std::time::Duration;

use agentsaga_core::Store;
use agentsaga_saga::{CompensationState, SagaId, StepState, query};
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

/// `remote`: the destinations other services serve.
pub(crate) fn spawn(store: Store, watch: StallWatch, remote: Vec<String>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut warned: HashSet<SagaId> = HashSet::new();
        let mut tick = tokio::time::interval(watch.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            look(&store, watch.threshold, &remote, &mut warned).await;
        }
    })
}

/// One look: warns of the sagas newly stalled, forgets those no longer stalled;
/// returns the stalled ones.
async fn look(
    store: &Store,
    threshold: Duration,
    remote: &[String],
    warned: &mut HashSet<SagaId>,
) -> Vec<SagaId> {
    let mut stalled = match query::stalled(store, threshold, MAX_REPORTED).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, "stall watch: query failed");
            return Vec::new();
        }
    };
    if !remote.is_empty() {
        let since = agentsaga_core::clock::now_ms()
            - i64::try_from(threshold.as_millis()).unwrap_or(i64::MAX / 2);
        let mut kept = Vec::with_capacity(stalled.len());
        for s in stalled {
            // Past the threshold it is stalled wherever its step is.
            if s.updated_at_ms < since || !waits_on(store, s.id, remote).await {
                kept.push(s);
            }
        }
        stalled = kept;
    }
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
    stalled.iter().map(|s| s.id).collect()
}

/// Is a step or a compensation of saga `id` on its way at one of the `remote`
/// destinations (a step dispatched there, or its compensation)?
async fn waits_on(store: &Store, id: SagaId, remote: &[String]) -> bool {
    let Ok(steps) = query::steps(store, id).await else {
        return false;
    };
    steps.iter().any(|step| {
        let doing = step.state == StepState::Dispatched && remote.contains(&step.destination);
        let undoing = step.compensation_state == Some(CompensationState::Dispatched)
            && step
                .compensation_destination
                .as_ref()
                .is_some_and(|d| remote.contains(d));
        doing || undoing
    })
}

#[cfg(test)]
mod tests {
    use agentsaga_core::testing::{Backend, fresh_url, wait_until};
    use agentsaga_saga::{Engine, Saga, Step};
    use serde_json::{Value, json};

    use super::*;

    // A saga whose command went to another service (published: nothing pending or in
    // flight here) is not stalled before the threshold; at a local destination the
    // same saga is (nothing will move it); past the threshold it is, wherever its step.
    #[tokio::test]
    async fn a_step_at_another_service_is_stalled_only_past_the_threshold() {
        let store = Store::connect(&fresh_url(Backend::Sqlite).await)
            .await
            .unwrap();
        let saga = Saga::<Value>::builder("order", 1)
            .step(
                Step::new("charge", "payments").compensate("payments", |_: &Value| json!("refund")),
            )
            .build()
            .unwrap();
        let engine = Engine::new([saga]).unwrap();
        let mut tx = store.begin().await.unwrap();
        let id = engine.start(&mut tx, "order", &json!({})).await.unwrap();
        tx.commit().await.unwrap();
        // The relay published the command: delivered.
        let sent = agentsaga_core::testing::claim(&store, &["payments".to_owned()], 1).await;
        store
            .queue()
            .mark_delivered("t", &[sent[0].seq])
            .await
            .unwrap();
        let (hour, remote) = (Duration::from_secs(3600), vec!["payments".to_owned()]);
        let mut warned = HashSet::new();
        assert_eq!(look(&store, hour, &remote, &mut warned).await, []);
        assert_eq!(look(&store, hour, &[], &mut warned).await, [id]);
        wait_until(
            "the saga is past a threshold of 1 ms",
            Duration::from_secs(10),
            async || look(&store, Duration::from_millis(1), &remote, &mut warned).await == [id],
        )
        .await;
        store.close().await;
    }
}
