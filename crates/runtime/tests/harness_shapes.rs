//! `testing::TestRuntime` on the other shapes a user tests: a planned saga (its steps a
//! plan given at start, as an LLM planner would give it) and a saga that runs a child
//! saga, each run to its end and under random faults from seeds, every saga's promises
//! checked (the children's too).

#[path = "support/echo.rs"]
mod echo;
#[path = "support/under_test.rs"]
mod under_test;

use std::time::Duration;

use agentsaga_core::RetryPolicy;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_runtime::testing::{Action, Fault, RandomFaults};
use agentsaga_runtime::{Runtime, RuntimeBuilder};
use agentsaga_saga::query::{self, ListFilter};
use agentsaga_saga::{Plan, PlanStart, PlanStep, PlannedSaga, Saga, SagaState, Step};
use echo::Echo;
use serde_json::{Value, json};

const MINUTE: Duration = Duration::from_secs(60);

/// A plan: look something up, book two things side by side (each undone by its
/// cancellation), then send (the pivot).
fn plan() -> Value {
    let book = |name: &str| {
        PlanStep::command(name, "calendar", json!({ "book": name }))
            .compensate("calendar", json!({ "cancel": name }))
    };
    let plan = Plan::new()
        .then(PlanStep::command("look", "search", json!({ "q": "sagas" })).nothing_to_undo())
        .parallel([book("book_a"), book("book_b")])
        .then(PlanStep::command("send", "mail", json!({ "to": "ann" })).pivot());
    serde_json::to_value(PlanStart::new(plan, json!({})).unwrap()).unwrap()
}

fn planned_runtime() -> RuntimeBuilder {
    let errand = PlannedSaga::builder("errand", 1)
        .destinations(["search", "calendar", "mail"])
        .build()
        .unwrap();
    ["search", "calendar", "mail"]
        .into_iter()
        .fold(Runtime::builder(), |b, d| b.agent(Echo(d)))
        .saga(errand)
}

// A planned saga runs its plan; the mail refused for good at the pivot undoes both
// bookings; under random faults from 25 seeds it keeps every promise.
async fn a_planned_saga_under_test(backend: Backend) {
    let t = under_test::start(backend, planned_runtime()).await;
    let id = t.start_saga("errand", &plan()).await.unwrap();
    assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Completed);
    assert_eq!(t.effects("calendar"), 2);
    t.shutdown().await;

    let t = under_test::start(backend, planned_runtime()).await;
    t.fail_next("mail", 1, &Fault::Fatal("mailbox full".into()));
    let id = t.start_saga("errand", &plan()).await.unwrap();
    assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Compensated);
    let undone: Vec<String> = t
        .ledger(id)
        .into_iter()
        .filter(|e| e.action == Action::Undone)
        .map(|e| e.step)
        .collect();
    assert_eq!(undone.len(), 2, "both bookings cancelled: {undone:?}");
    t.check_promises(id).await.unwrap();
    t.shutdown().await;

    let report = RandomFaults::new(0..25)
        .check_on(
            async || fresh_url(backend).await,
            planned_runtime,
            "errand",
            &plan(),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("planned: {report}");
    if std::env::var(agentsaga_runtime::testing::SEED_VAR).is_err() {
        assert!(report.ended("compensated") > 0, "{report}");
    }
}

fn nested_runtime() -> RuntimeBuilder {
    let retry = RetryPolicy::new(MINUTE, 10 * MINUTE, 4);
    let stay = Saga::<Value>::builder("stay", 1)
        .step(
            Step::new("room", "hotel")
                .compensate("hotel", |_: &Value| json!({ "cancel": "room" }))
                .retry(retry),
        )
        .step(
            Step::new("table", "restaurant")
                .compensate("restaurant", |_: &Value| json!({ "cancel": "table" }))
                .retry(retry),
        )
        .build()
        .unwrap();
    let trip = Saga::<Value>::builder("trip", 1)
        .step(
            Step::new("flight", "airline")
                .compensate("airline", |_: &Value| json!({ "cancel": "flight" }))
                .retry(retry),
        )
        .step(Step::saga("stay", "stay"))
        .pivot(Step::new("charge", "payments").retry(retry))
        .build()
        .unwrap();
    ["airline", "hotel", "restaurant", "payments"]
        .into_iter()
        .fold(Runtime::builder(), |b, d| b.agent(Echo(d)))
        .saga(stay)
        .saga(trip)
}

// A saga whose step is a child saga: declined at the pivot, the child is undone as a
// whole (its own steps in reverse), then the flight; under random faults from 25
// seeds every saga, parent and child, keeps its promises.
async fn a_saga_with_a_child_under_test(backend: Backend) {
    let t = under_test::start(backend, nested_runtime()).await;
    t.fail_next("payments", 1, &Fault::Fatal("card declined".into()));
    let id = t.start_saga("trip", &json!({})).await.unwrap();
    assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Compensated);
    let children = query::list(
        t.store(),
        &ListFilter {
            parent: Some(id),
            ..ListFilter::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(children.len(), 1);
    let child = children[0].id;
    assert_eq!(t.state(child).await.unwrap(), SagaState::Compensated);
    let undone = |id| -> Vec<String> {
        t.ledger(id)
            .into_iter()
            .filter(|e| e.action == Action::Undone)
            .map(|e| e.step)
            .collect()
    };
    assert_eq!(undone(child), ["table", "room"]);
    assert_eq!(undone(id), ["flight"]);
    // One trace for the parent and its child, rooted at the parent's start.
    let trace = t.trace(id).unwrap();
    assert_eq!(trace.roots(), ["saga.start"], "{:?}", trace.spans());
    let mut both = vec![id.to_string(), child.to_string()];
    both.sort();
    assert_eq!(trace.sagas(), both);
    assert_eq!(
        t.trace(child).unwrap().spans(),
        trace.spans(),
        "the same trace"
    );
    t.check_promises(id).await.unwrap();
    t.check_promises(child).await.unwrap();
    t.shutdown().await;

    let report = RandomFaults::new(0..25)
        .check_on(
            async || fresh_url(backend).await,
            nested_runtime,
            "trip",
            &json!({}),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("nested: {report}");
    if std::env::var(agentsaga_runtime::testing::SEED_VAR).is_err() {
        assert!(report.ended("compensated") > 0, "{report}");
        assert!(report.ended("completed") > 0, "{report}");
    }
}

agentsaga_core::both_backends!(a_planned_saga_under_test, a_planned_saga_under_test);
agentsaga_core::both_backends!(
    a_saga_with_a_child_under_test,
    a_saga_with_a_child_under_test
);
