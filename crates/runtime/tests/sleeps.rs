//! Sagas that sleep (`Step::sleep`), through the runtime on both backends: the saga
//! parks holding nothing, its process may stop and another take over, and it wakes at
//! its time and goes on; a wait that ends by time (`or_after`) takes its other path.

#[path = "support/gated.rs"]
mod gated;
#[path = "support/settle.rs"]
mod settle;

use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::both_backends;
use agentsaga_core::clock::system_now_ms as now_ms;
use agentsaga_core::testing::{Backend, fresh_url, wait_until};
use agentsaga_runtime::Runtime;
use agentsaga_saga::query::{self, ListFilter};
use agentsaga_saga::{Saga, SagaDefinition, SagaId, SagaState, Step};
use gated::{Answer, Gates};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use settle::settle;

#[derive(Clone, Serialize, Deserialize)]
struct Mail {
    to: String,
    replied: Option<String>,
}

/// `send`, then a sleep of `nap` (or a wait for `reply` ending after `nap`), then
/// `follow_up` (the pivot), which says whether a reply came.
fn follow_up(nap: Duration, wait_for_reply: bool) -> SagaDefinition {
    let pause = if wait_for_reply {
        Step::wait_for("reply")
            .agents_may_signal()
            .or_after(nap)
            .on_reply(|m: &mut Mail, r: String| m.replied = Some(r))
    } else {
        Step::sleep("nap", nap)
    };
    Saga::<Mail>::builder("follow_up", 1)
        .step(
            Step::new("send", "mailer")
                .command(|m: &Mail| json!({ "send": m.to }))
                .nothing_to_undo(),
        )
        .step(pause)
        .pivot(
            Step::new("follow_up", "mailer")
                .command(|m: &Mail| json!({ "to": m.to, "replied": m.replied })),
        )
        .build()
        .unwrap()
}

async fn start_runtime(def: SagaDefinition, gates: &Gates) -> Runtime {
    let ok: Answer = Arc::new(|_, _, _, _| Ok(json!("ok")));
    gates
        .agents(&["mailer"], &ok)
        .saga(def)
        .start()
        .await
        .unwrap()
}

fn mail() -> Mail {
    Mail {
        to: "ann@example.com".into(),
        replied: None,
    }
}

async fn sleeping(rt: &Runtime, id: SagaId) -> Option<i64> {
    query::get(rt.store(), id)
        .await
        .unwrap()
        .unwrap()
        .sleeping_until_ms
}

fn sent(gates: &Gates) -> Vec<Value> {
    gates.seen().into_iter().map(|(_, v)| v).collect()
}

// The saga sleeps 1.5 s; its process stops while it sleeps and another starts on the
// same database: the saga wakes at its time, not before, and completes. The sleeping
// saga is listed (`sagas list --sleeping`), and not as stalled.
async fn a_sleep_survives_a_restart_and_wakes_at_its_time(backend: Backend) {
    let nap = Duration::from_millis(1500);
    let gates = Gates::new(fresh_url(backend).await, true);
    let rt = start_runtime(follow_up(nap, false), &gates).await;
    let id = rt.start_saga("follow_up", &mail()).await.unwrap();
    let mut due = None;
    wait_until("the saga sleeps", Duration::from_secs(30), async || {
        due = sleeping(&rt, id).await;
        due.is_some()
    })
    .await;
    let due = due.unwrap();
    let listed = query::list(
        rt.store(),
        &ListFilter {
            sleeping: true,
            ..ListFilter::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(listed.iter().map(|s| s.id).collect::<Vec<_>>(), [id]);
    assert!(
        query::stalled(rt.store(), Duration::ZERO, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(sent(&gates).len(), 1, "only `send` so far");
    rt.shutdown().await;

    let rt = start_runtime(follow_up(nap, false), &gates).await;
    assert_eq!(settle(&rt, id).await, SagaState::Completed);
    let steps = query::steps(rt.store(), id).await.unwrap();
    let woke = steps[1].replied_at_ms.unwrap();
    assert!(woke >= due - 5, "woke at {woke}, before its time {due}");
    assert!(now_ms() >= due);
    assert_eq!(sent(&gates).len(), 2, "`follow_up` once");
    rt.shutdown().await;
}
both_backends!(restart, a_sleep_survives_a_restart_and_wakes_at_its_time);

// `wait_for("reply").or_after(…)`: the saga whose reply came follows up knowing it;
// the other follows up after the wait's time, without one.
async fn a_wait_ends_by_its_reply_or_by_its_time(backend: Backend) {
    let gates = Gates::new(fresh_url(backend).await, true);
    let rt = start_runtime(follow_up(Duration::from_millis(800), true), &gates).await;
    let answered = rt.start_saga("follow_up", &mail()).await.unwrap();
    let silent = rt.start_saga("follow_up", &mail()).await.unwrap();
    for id in [answered, silent] {
        wait_until(
            "the saga waits for a reply",
            Duration::from_secs(30),
            async || {
                query::get(rt.store(), id)
                    .await
                    .unwrap()
                    .unwrap()
                    .waiting_for
                    .as_deref()
                    == Some("reply")
            },
        )
        .await;
    }
    rt.signal(
        answered,
        "reply",
        agentsaga_saga::Signal::Approve(json!("thanks")),
    )
    .await
    .unwrap();
    assert_eq!(settle(&rt, answered).await, SagaState::Completed);
    assert_eq!(settle(&rt, silent).await, SagaState::Completed);
    let follow_ups: Vec<Value> = sent(&gates)
        .into_iter()
        .filter(|v| v.get("replied").is_some())
        .collect();
    assert_eq!(follow_ups.len(), 2, "{follow_ups:?}");
    assert!(follow_ups.contains(&json!({ "to": "ann@example.com", "replied": "thanks" })));
    assert!(follow_ups.contains(&json!({ "to": "ann@example.com", "replied": null })));
    rt.shutdown().await;
}
both_backends!(or_after, a_wait_ends_by_its_reply_or_by_its_time);
