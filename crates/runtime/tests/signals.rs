//! Sagas that wait for a signal (`Step::wait_for`), on both backends: approved, the
//! payload folds in and the saga goes on; rejected or timed out before the pivot, it
//! compensates; timed out after it, it is stuck; an early signal is kept; a duplicate
//! changes nothing; a signal it cannot take is a typed error that writes nothing; a
//! parked saga survives a restart of its process.

#[path = "support/gated.rs"]
mod gated;
#[path = "support/settle.rs"]
mod settle;

use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::both_backends;
use agentsaga_core::testing::{Backend, fresh_url, wait_until};
use agentsaga_runtime::Runtime;
use agentsaga_saga::query::{self, ListFilter};
use agentsaga_saga::{Error as SagaError, Saga, SagaDefinition, SagaId, SagaState, Signal};
use agentsaga_saga::{SignalReceipt, Step};
use gated::{Answer, Gates, assert_signal_refused};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use settle::{assert_error_contains, settle};

#[derive(Clone, Serialize, Deserialize)]
struct Mail {
    to: String,
    approved_by: Option<String>,
}

#[derive(Deserialize)]
struct Approval {
    by: String,
}

/// `draft` (undone by `discard`), a wait for `approval`, then `send` (the pivot).
fn approval_saga(timeout: Option<Duration>) -> SagaDefinition {
    let mut wait =
        Step::wait_for("approval").on_reply(|m: &mut Mail, a: Approval| m.approved_by = Some(a.by));
    if let Some(t) = timeout {
        wait = wait.timeout(t);
    }
    Saga::<Mail>::builder("mail", 1)
        .step(
            Step::new("draft", "drafts")
                .compensate("discard", |m: &Mail| json!({ "discard": m.to })),
        )
        .step(wait)
        .pivot(
            Step::new("send", "sender")
                .command(|m: &Mail| json!({ "to": m.to, "approved_by": m.approved_by })),
        )
        .build()
        .unwrap()
}

/// The pivot first, then a wait with a short timeout: past the pivot, a wait that
/// times out leaves the saga stuck.
fn wait_after_pivot() -> SagaDefinition {
    Saga::<Mail>::builder("late", 1)
        .pivot(Step::new("send", "sender"))
        .step(Step::wait_for("receipt").timeout(Duration::from_millis(300)))
        .build()
        .unwrap()
}

struct World {
    rt: Runtime,
    gates: Gates,
}

/// The agents `drafts`, `discard` and `sender`, gated, each answering `"ok"`.
async fn start_runtime(defs: Vec<SagaDefinition>, gates: &Gates) -> Runtime {
    let ok: Answer = Arc::new(|_, _, _, _| Ok(json!("ok")));
    let destinations = ["drafts", "discard", "sender"];
    let mut b = gates.agents(&destinations, &ok);
    for d in defs {
        b = b.saga(d);
    }
    b.start().await.unwrap()
}

async fn world(backend: Backend, defs: Vec<SagaDefinition>, open: bool) -> World {
    let gates = Gates::new(fresh_url(backend).await, open);
    let rt = start_runtime(defs, &gates).await;
    World { rt, gates }
}

fn mail() -> Mail {
    Mail {
        to: "ann@example.com".into(),
        approved_by: None,
    }
}

async fn waiting_for(rt: &Runtime, id: SagaId) -> Option<String> {
    query::get(rt.store(), id)
        .await
        .unwrap()
        .and_then(|s| s.waiting_for)
}

async fn until_waiting(rt: &Runtime, id: SagaId) {
    wait_until(
        "the saga waits for its approval",
        Duration::from_secs(30),
        async || waiting_for(rt, id).await.as_deref() == Some("approval"),
    )
    .await;
}

fn sent(w: &World, destination: &str) -> Vec<Value> {
    w.gates
        .seen()
        .into_iter()
        .filter(|(d, _)| d == destination)
        .map(|(_, v)| v)
        .collect()
}

// Approved: the payload folds into the data and the pivot sees it; a second signal for
// the same wait changes nothing; the parked saga is listed as waiting.
async fn approved_goes_on(backend: Backend) {
    let w = world(backend, vec![approval_saga(None)], true).await;
    let id = w.rt.start_saga("mail", &mail()).await.unwrap();
    until_waiting(&w.rt, id).await;
    let listed = query::list(
        w.rt.store(),
        &ListFilter {
            waiting: true,
            ..ListFilter::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, id);
    assert!(
        sent(&w, "sender").is_empty(),
        "nothing sent before the approval"
    );

    // Both in one transaction: the saga cannot go on (and finish, which refuses any
    // later signal) before the second is answered. Two transactions raced that.
    let approve = Signal::Approve(json!({ "by": "ops" }));
    let mut tx = w.rt.store().begin().await.unwrap();
    assert_eq!(
        w.rt.signal_in(&mut tx, id, "approval", approve)
            .await
            .unwrap(),
        SignalReceipt::Recorded
    );
    assert_eq!(
        w.rt.signal_in(&mut tx, id, "approval", Signal::Reject("too late".into()))
            .await
            .unwrap(),
        SignalReceipt::Duplicate
    );
    tx.commit().await.unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Completed);
    assert_eq!(
        sent(&w, "sender"),
        [json!({ "to": "ann@example.com", "approved_by": "ops" })]
    );
    assert!(sent(&w, "discard").is_empty());
    assert_eq!(waiting_for(&w.rt, id).await, None);
}
both_backends!(approved_tests, approved_goes_on);

// Rejected before the pivot: the saga compensates (the draft is discarded).
async fn rejected_compensates(backend: Backend) {
    let w = world(backend, vec![approval_saga(None)], true).await;
    let id = w.rt.start_saga("mail", &mail()).await.unwrap();
    until_waiting(&w.rt, id).await;
    w.rt.signal(id, "approval", Signal::Reject("not this one".into()))
        .await
        .unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Compensated);
    assert_eq!(
        sent(&w, "discard"),
        [json!({ "discard": "ann@example.com" })]
    );
    assert!(sent(&w, "sender").is_empty());
    assert_error_contains(&w.rt, id, "not this one").await;
}
both_backends!(rejected_tests, rejected_compensates);

// A signal sent before the saga reaches its wait is kept and used when it gets there.
async fn early_signal_is_kept(backend: Backend) {
    let w = world(backend, vec![approval_saga(None)], false).await;
    let id = w.rt.start_saga("mail", &mail()).await.unwrap();
    // `draft` waits at the gate: the saga has not reached its wait.
    w.rt.signal(id, "approval", Signal::Approve(json!({ "by": "early" })))
        .await
        .unwrap();
    w.gates.open.send_replace(true);
    assert_eq!(settle(&w.rt, id).await, SagaState::Completed);
    assert_eq!(
        sent(&w, "sender"),
        [json!({ "to": "ann@example.com", "approved_by": "early" })]
    );
}
both_backends!(early_tests, early_signal_is_kept);

// Sagas started in one batch (`start_sagas_in`) have their waits registered with them:
// an early signal to each is kept and used.
async fn batch_started_sagas_wait_too(backend: Backend) {
    let w = world(backend, vec![approval_saga(None)], false).await;
    let mut tx = w.rt.store().begin().await.unwrap();
    let ids =
        w.rt.start_sagas_in(&mut tx, "mail", &[mail(), mail()])
            .await
            .unwrap();
    tx.commit().await.unwrap();
    for (n, id) in ids.iter().enumerate() {
        let by = format!("ops{n}");
        assert_eq!(
            w.rt.signal(*id, "approval", Signal::Approve(json!({ "by": by })))
                .await
                .unwrap(),
            SignalReceipt::Recorded
        );
    }
    w.gates.open.send_replace(true);
    for id in &ids {
        assert_eq!(settle(&w.rt, *id).await, SagaState::Completed);
    }
    let mut approvers: Vec<Value> = sent(&w, "sender")
        .into_iter()
        .map(|v| v["approved_by"].clone())
        .collect();
    approvers.sort_by_key(Value::to_string);
    assert_eq!(approvers, [json!("ops0"), json!("ops1")]);
}
both_backends!(batch_tests, batch_started_sagas_wait_too);

// Misaddressed signals are typed errors and write nothing.
async fn misaddressed_signals_write_nothing(backend: Backend) {
    let w = world(backend, vec![approval_saga(None)], true).await;
    let id = w.rt.start_saga("mail", &mail()).await.unwrap();
    until_waiting(&w.rt, id).await;
    let before = w.rt.store().admin().stats().await.unwrap();
    let unknown = SagaId::new();
    let err =
        w.rt.signal(unknown, "approval", Signal::Approve(Value::Null))
            .await
            .unwrap_err();
    assert!(
        matches!(err, agentsaga_runtime::Error::Saga(SagaError::NotFound(i)) if i == unknown),
        "{err}"
    );
    assert_signal_refused(&w.rt, id, "payment").await;
    let after = w.rt.store().admin().stats().await.unwrap();
    assert_eq!(
        (after.pending + after.in_flight + after.delivered + after.dead),
        (before.pending + before.in_flight + before.delivered + before.dead),
        "no message written"
    );
    assert_eq!(waiting_for(&w.rt, id).await.as_deref(), Some("approval"));

    w.rt.signal(id, "approval", Signal::Approve(json!({ "by": "ops" })))
        .await
        .unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Completed);
    let err =
        w.rt.signal(id, "approval", Signal::Approve(Value::Null))
            .await
            .unwrap_err();
    assert!(
        matches!(err, agentsaga_runtime::Error::Saga(SagaError::SignalRefused { ref reason, .. }) if reason.contains("completed")),
        "{err}"
    );
}
both_backends!(misaddressed_tests, misaddressed_signals_write_nothing);

// A wait's timeout: before the pivot the saga compensates; after it, it is stuck.
async fn wait_timeouts(backend: Backend) {
    let w = world(
        backend,
        vec![
            approval_saga(Some(Duration::from_millis(300))),
            wait_after_pivot(),
        ],
        true,
    )
    .await;
    let before = w.rt.start_saga("mail", &mail()).await.unwrap();
    let after = w.rt.start_saga("late", &mail()).await.unwrap();
    assert_eq!(settle(&w.rt, before).await, SagaState::Compensated);
    assert_eq!(sent(&w, "discard").len(), 1);
    assert_eq!(settle(&w.rt, after).await, SagaState::Stuck);
    assert_error_contains(&w.rt, after, "receipt").await;
}
both_backends!(timeout_tests, wait_timeouts);

// A parked saga holds nothing in its process: a new process takes the signal.
async fn survives_a_restart(backend: Backend) {
    let w = world(backend, vec![approval_saga(None)], true).await;
    let id = w.rt.start_saga("mail", &mail()).await.unwrap();
    until_waiting(&w.rt, id).await;
    let World { rt, gates } = w;
    rt.shutdown().await;
    let rt = start_runtime(vec![approval_saga(None)], &gates).await;
    rt.signal(
        id,
        "approval",
        Signal::Approve(json!({ "by": "after restart" })),
    )
    .await
    .unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Completed);
    let w = World { rt, gates };
    assert_eq!(
        sent(&w, "sender"),
        [json!({ "to": "ann@example.com", "approved_by": "after restart" })]
    );
}
both_backends!(restart_tests, survives_a_restart);
