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
/// The most pages of candidates one look reads when some wait on other services.
const MAX_PAGES: usize = 20;

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
    look_in_pages(store, threshold, remote, warned, MAX_REPORTED).await
}

/// [`look`], reading the candidates `page` at a time.
async fn look_in_pages(
    store: &Store,
    threshold: Duration,
    remote: &[String],
    warned: &mut HashSet<SagaId>,
    page: u32,
) -> Vec<SagaId> {
    let stalled = match stalled(store, threshold, remote, page).await {
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

/// At most `page` stalled sagas, newest first. With `remote` destinations, the
/// candidates whose step is at one of them and that are not yet past the threshold are
/// left out, reading further pages (at most [`MAX_PAGES`]) so that sagas stalled here
/// are found behind any number of sagas waiting on other services.
async fn stalled(
    store: &Store,
    threshold: Duration,
    remote: &[String],
    page: u32,
) -> agentsaga_saga::Result<Vec<query::SagaSummary>> {
    if remote.is_empty() {
        return query::stalled(store, threshold, page).await;
    }
    let since = agentsaga_core::clock::now_ms()
        - i64::try_from(threshold.as_millis()).unwrap_or(i64::MAX / 2);
    let mut kept = Vec::new();
    let mut filter = query::ListFilter {
        stalled: Some(threshold),
        limit: page,
        ..query::ListFilter::default()
    };
    for _ in 0..MAX_PAGES {
        let candidates = query::list(store, &filter).await?;
        let last = candidates.len() < page as usize;
        filter.after = candidates.last().map(query::Cursor::after);
        for s in candidates {
            // Past the threshold it is stalled wherever its step is.
            if s.updated_at_ms < since || !waits_on(store, s.id, remote).await {
                kept.push(s);
                if kept.len() == page as usize {
                    return Ok(kept);
                }
            }
        }
        if last {
            return Ok(kept);
        }
    }
    tracing::debug!(
        pages = MAX_PAGES,
        "stall watch: stopped reading candidates waiting on other services"
    );
    Ok(kept)
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

    // A saga stalled here, older than a page of sagas waiting on another service, is
    // found behind them.
    #[tokio::test]
    async fn a_saga_stalled_here_is_found_behind_a_page_of_remote_ones() {
        let store = Store::connect(&fresh_url(Backend::Sqlite).await)
            .await
            .unwrap();
        let one_step = |name: &str, to: &str| {
            Saga::<Value>::builder(name, 1)
                .step(Step::new("do", to).nothing_to_undo())
                .build()
                .unwrap()
        };
        let engine =
            Engine::new([one_step("here", "stock"), one_step("there", "payments")]).unwrap();
        let mut ids = Vec::new();
        for name in ["here", "there", "there", "there"] {
            let mut tx = store.begin().await.unwrap();
            ids.push(engine.start(&mut tx, name, &json!({})).await.unwrap());
            tx.commit().await.unwrap();
            // Newest first is by creation time (ms): one saga per ms.
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        // Every command delivered: nothing pending or in flight for any of them.
        let names = ["stock".to_owned(), "payments".to_owned()];
        let sent = agentsaga_core::testing::claim(&store, &names, 10).await;
        let seqs: Vec<i64> = sent.iter().map(|m| m.seq).collect();
        assert_eq!(seqs.len(), 4);
        store.queue().mark_delivered("t", &seqs).await.unwrap();
        let (hour, remote) = (Duration::from_secs(3600), vec!["payments".to_owned()]);
        let mut warned = HashSet::new();
        let found = look_in_pages(&store, hour, &remote, &mut warned, 2).await;
        assert_eq!(found, [ids[0]]);
        store.close().await;
    }
}
