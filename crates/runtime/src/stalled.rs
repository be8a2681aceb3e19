//! The stall watch: finds stalled sagas (running or compensating, not parked at a
//! wait, with nothing on its way for any of their steps, or no progress for longer
//! than a threshold: [`agentsaga_saga::query::stalled`]) every so often, logs a
//! warning once per stalled saga, and keeps the `agentsaga_sagas_stalled` gauge (and
//! the `agentsaga_stalled_warnings_total` counter) current.
//!
//! A saga whose live step went to a destination served by another service (feature
//! `nats`: [`RuntimeBuilder::remote`](crate::RuntimeBuilder::remote)) has its command
//! delivered and its answer awaited: the query counts it as stalled only past the
//! threshold, as the console and the CLI do.

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
            look(&store, watch.threshold, &mut warned, MAX_REPORTED).await;
        }
    })
}

/// One look, at most `page` sagas: warns of the sagas newly stalled, forgets those no
/// longer stalled; returns the stalled ones.
async fn look(
    store: &Store,
    threshold: Duration,
    warned: &mut HashSet<SagaId>,
    page: u32,
) -> Vec<SagaId> {
    let stalled = match query::stalled(store, threshold, page).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, "stall watch: query failed");
            return Vec::new();
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
    stalled.iter().map(|s| s.id).collect()
}

#[cfg(test)]
mod tests {
    use agentsaga_core::queue::DeadLetter;
    use agentsaga_core::testing::{backends, fresh_url, wait_until};
    use agentsaga_saga::{Engine, Saga, Step};
    use serde_json::{Value, json};

    use super::*;

    /// A store with the sagas `here` (its step at `stock`) and `there` (at
    /// `payments`), each of one step.
    async fn store_and_engine() -> (Store, Engine) {
        let store = Store::connect(&fresh_url(backends()[0]).await)
            .await
            .unwrap();
        let one_step = |name: &str, to: &str| {
            Saga::<Value>::builder(name, 1)
                .step(Step::new("do", to).compensate(to, |_: &Value| json!("undo")))
                .build()
                .unwrap()
        };
        let engine =
            Engine::new([one_step("here", "stock"), one_step("there", "payments")]).unwrap();
        (store, engine)
    }

    /// Starts `name`, then finishes its command: delivered (to another service, say),
    /// or dead-lettered (nothing will move the saga).
    async fn start(store: &Store, engine: &Engine, name: &str, delivered: bool) -> SagaId {
        let mut tx = store.begin().await.unwrap();
        let id = engine.start(&mut tx, name, &json!({})).await.unwrap();
        tx.commit().await.unwrap();
        let to = if name == "here" { "stock" } else { "payments" };
        let sent = agentsaga_core::testing::claim(store, &[to.to_owned()], 1).await;
        let queue = store.queue();
        if delivered {
            queue.mark_delivered("t", &[sent[0].seq]).await.unwrap();
        } else {
            let dead = DeadLetter {
                seq: sent[0].seq,
                reason: "refused".into(),
                notice: None,
            };
            queue.dead_letter("t", &[dead]).await.unwrap();
        }
        // Newest first is by creation time (ms): one saga per ms.
        tokio::time::sleep(Duration::from_millis(3)).await;
        id
    }

    // A saga whose command was delivered (to another service: nothing pending or in
    // flight here, its answer awaited) is not stalled before the threshold; one whose
    // command went to the dead letters is at once (nothing will move it); past the
    // threshold both are.
    #[tokio::test]
    async fn a_step_at_another_service_is_stalled_only_past_the_threshold() {
        let (store, engine) = store_and_engine().await;
        let waiting = start(&store, &engine, "there", true).await;
        let hour = Duration::from_secs(3600);
        let mut warned = HashSet::new();
        assert_eq!(look(&store, hour, &mut warned, 100).await, []);
        let dead = start(&store, &engine, "there", false).await;
        assert_eq!(look(&store, hour, &mut warned, 100).await, [dead]);
        wait_until(
            "the sagas are past a threshold of 1 ms",
            Duration::from_secs(10),
            async || {
                look(&store, Duration::from_millis(1), &mut warned, 100).await == [dead, waiting]
            },
        )
        .await;
        store.close().await;
    }

    // A saga stalled here, older than a page of sagas waiting on another service, is
    // found behind them: the query leaves those out, not a filter after its cut.
    #[tokio::test]
    async fn a_saga_stalled_here_is_found_behind_a_page_of_remote_ones() {
        let (store, engine) = store_and_engine().await;
        let stalled = start(&store, &engine, "here", false).await;
        for _ in 0..3 {
            start(&store, &engine, "there", true).await;
        }
        let mut warned = HashSet::new();
        let hour = Duration::from_secs(3600);
        assert_eq!(look(&store, hour, &mut warned, 2).await, [stalled]);
        store.close().await;
    }
}
