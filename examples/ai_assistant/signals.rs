//! Who sends the sagas' signals, besides a person with `agentsaga sagas signal`: the
//! `--auto-approve` approver (as a person would) and the companies' simulated inbox
//! (`--reply-rate`: a reply to the email, an agent's signal).

use super::*;

use std::collections::HashMap;

use agentsaga::saga::query::{self, ListFilter};
use agentsaga::saga::{Engine, SignalSender, StepState};

/// What the companies answer, picked by the seed and the request.
const REPLIES: [&str; 3] = [
    "Thanks, a meeting sounds good: let us find a time.",
    "We are interested; could you send more details first?",
    "Not now, thank you. Let us talk again next quarter.",
];

/// The sagas waiting for a signal now.
async fn waiting(store: &Store) -> Vec<query::SagaSummary> {
    let filter = ListFilter {
        waiting: true,
        limit: 1000,
        ..ListFilter::default()
    };
    query::list(store, &filter).await.unwrap_or_default()
}

/// Sends `signal` to saga `id`'s wait `name`, as `sender`, in a transaction of its own.
async fn send(
    store: &Store,
    id: SagaId,
    name: &str,
    signal: Signal,
    sender: SignalSender,
) -> anyhow::Result<()> {
    let mut tx = store.begin().await?;
    Engine::signal_by(&mut tx, id, name, signal, sender).await?;
    tx.commit().await?;
    Ok(())
}

/// `--auto-approve`: approves each saga that waits for its approval, as a person would.
pub(super) async fn auto_approve(store: Store) {
    loop {
        for saga in waiting(&store).await {
            if saga.waiting_for.as_deref() != Some(APPROVAL) {
                continue;
            }
            let signal = Signal::Approve(serde_json::json!({ "by": "auto-approve" }));
            if let Err(e) = send(&store, saga.id, APPROVAL, signal, SignalSender::Person).await {
                tracing::warn!(saga.id = %saga.id, error = %e, "auto-approve failed; trying again");
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `--reply-rate`: the companies' inbox. A saga that waits for the company's `reply`
/// gets one with probability `rate`, decided by the seed and the saga's request key
/// (a rerun decides alike), at a time in the first half of its wait (by its
/// deadline, `wakes_at_ms`); the others get none, and their wait ends by time. The
/// reply is an agent's signal (`SignalSender::Agent`), which the saga takes for
/// `reply` (`agent_signals`) and would refuse for `approval`.
pub(super) async fn inbox(store: Store, seed: u64, rate: f64) {
    // When each waiting saga gets its reply (`None`: it gets none, or has had it).
    let mut due: HashMap<SagaId, Option<(i64, Value)>> = HashMap::new();
    loop {
        let replying: Vec<query::SagaSummary> = waiting(&store)
            .await
            .into_iter()
            .filter(|s| s.waiting_for.as_deref() == Some(REPLY))
            .collect();
        due.retain(|id, _| replying.iter().any(|s| s.id == *id));
        let now = store.clock().now_ms();
        for saga in &replying {
            let reply = match due.get(&saga.id) {
                Some(reply) => reply.clone(),
                None => {
                    let reply = reply_for(&store, saga, seed, rate).await;
                    due.insert(saga.id, reply.clone());
                    reply
                }
            };
            let Some((at, reply)) = reply else {
                continue;
            };
            if at > now {
                continue;
            }
            let signal = Signal::Approve(reply);
            match send(&store, saga.id, REPLY, signal, SignalSender::Agent).await {
                Ok(()) => {
                    due.insert(saga.id, None);
                }
                Err(e) => tracing::warn!(saga.id = %saga.id, error = %e, "the reply was not taken"),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The reply saga `saga` gets, and when (Unix ms), if it gets one.
async fn reply_for(
    store: &Store,
    saga: &query::SagaSummary,
    seed: u64,
    rate: f64,
) -> Option<(i64, Value)> {
    let who = saga.key.clone().unwrap_or_else(|| saga.id.to_string());
    if support::roll(seed, &who, "reply") >= rate {
        return None;
    }
    let steps = query::steps(store, saga.id).await.ok()?;
    let wait = steps
        .iter()
        .find(|s| s.destination == format!("signal:{REPLY}") && s.state == StepState::Dispatched)?;
    let (from, until) = (wait.dispatched_at_ms?, wait.wakes_at_ms?);
    let at = from + ((until - from) as f64 * support::roll(seed, &who, "reply at") / 2.0) as i64;
    let pick = (support::roll(seed, &who, "reply text") * REPLIES.len() as f64) as usize;
    let text = REPLIES[pick.min(REPLIES.len() - 1)];
    Some((at, serde_json::json!({ "text": text })))
}
