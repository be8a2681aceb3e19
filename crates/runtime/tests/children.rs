//! Child sagas through the runtime, on both backends: a `business_travel` saga whose
//! `book` step is a `trip_booking` saga of its own. The child's outcome is the step's;
//! a parent that turns back after its child completed undoes the child's effects, in
//! reverse, before its own; each effect happens once; the child shows under its parent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga_core::both_backends;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_runtime::{Agent, AgentContext, Runtime, StepError};
use agentsaga_saga::query::{self, ListFilter};
use agentsaga_saga::{Saga, SagaDefinition, SagaId, SagaState, Step};
use serde_json::{Value, json};

type D = Value;
/// What the agents did, in order: (destination, saga, compensation?).
type Seen = Arc<Mutex<Vec<(String, SagaId, bool)>>>;

/// Records each command and compensation; fails fatally a command whose data says so.
struct Recorder {
    destination: &'static str,
    seen: Seen,
}

#[async_trait::async_trait]
impl Agent for Recorder {
    type Command = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        self.destination
    }
    async fn handle(&self, ctx: &mut AgentContext<'_>, cmd: Value) -> Result<Value, StepError> {
        let undo = ctx.is_compensation();
        if !undo && cmd.get("fail") == Some(&json!(self.destination)) {
            return Err(StepError::fatal(format!("{} refused", self.destination)));
        }
        let saga = ctx.saga_id().expect("a saga's command");
        self.seen
            .lock()
            .unwrap()
            .push((self.destination.to_owned(), saga, undo));
        Ok(json!({ "by": self.destination }))
    }
}

fn step(name: &'static str) -> Step<D, agentsaga_saga::Undoable> {
    Step::<D>::new(name, name).compensate(name, |_: &D| json!({ "undo": true }))
}

fn trip_booking() -> SagaDefinition {
    Saga::<D>::builder("trip_booking", 1)
        .step(step("flight").command(|d: &D| d.clone()))
        .step(step("hotel").command(|d: &D| d.clone()))
        .build()
        .unwrap()
}

fn business_travel() -> SagaDefinition {
    Saga::<D>::builder("business_travel", 1)
        .step(step("visa").command(|d: &D| d.clone()))
        .step(
            Step::saga("book", "trip_booking")
                .command(|d: &D| d.clone())
                .on_reply(|d: &mut D, trip: Value| d["trip"] = trip),
        )
        .step(step("expense").command(|d: &D| d.clone()))
        .build()
        .unwrap()
}

async fn runtime(backend: Backend, seen: &Seen) -> Runtime {
    let mut b = Runtime::builder()
        .database(&fresh_url(backend).await)
        .saga(trip_booking())
        .saga(business_travel());
    for destination in ["visa", "flight", "hotel", "expense"] {
        b = b.agent(Recorder {
            destination,
            seen: Arc::clone(seen),
        });
    }
    b.start().await.unwrap()
}

async fn settle(rt: &Runtime, id: SagaId) -> SagaState {
    tokio::time::timeout(Duration::from_secs(30), rt.wait(id))
        .await
        .expect("the saga settles")
        .unwrap()
}

/// The one child of `parent`.
async fn child_of(rt: &Runtime, parent: SagaId) -> query::SagaSummary {
    let filter = ListFilter {
        parent: Some(parent),
        ..ListFilter::default()
    };
    let mut children = query::list(rt.store(), &filter).await.unwrap();
    assert_eq!(children.len(), 1, "one child per child step: {children:?}");
    children.pop().unwrap()
}

// The child completes, its data becomes the step's reply, the parent goes on.
async fn a_trip_inside_a_business_travel(backend: Backend) {
    let seen = Seen::default();
    let rt = runtime(backend, &seen).await;
    let id = rt
        .start_saga("business_travel", &json!({ "who": "ann" }))
        .await
        .unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Completed);
    let child = child_of(&rt, id).await;
    assert_eq!(
        (child.name.as_str(), child.state),
        ("trip_booking", SagaState::Completed)
    );
    assert_eq!(child.parent_id, Some(id));
    let seen = seen.lock().unwrap().clone();
    let order: Vec<(&str, bool)> = seen
        .iter()
        .map(|(d, s, _)| (d.as_str(), *s == id))
        .collect();
    assert_eq!(
        order,
        [
            ("visa", true),
            ("flight", false),
            ("hotel", false),
            ("expense", true)
        ],
        "the child's steps ran between the parent's, under the child's id"
    );
    let data = query::data(rt.store(), id).await.unwrap().unwrap();
    assert_eq!(
        data["trip"],
        json!({ "who": "ann" }),
        "the child's data: {data}"
    );
    rt.shutdown().await;
}
both_backends!(completes_tests, a_trip_inside_a_business_travel);

// The expense is refused after the trip was booked: the trip is undone as a whole
// (hotel, then flight), then the visa. Every effect and every undo happens once.
async fn a_booked_trip_is_undone_when_its_parent_turns_back(backend: Backend) {
    let seen = Seen::default();
    let rt = runtime(backend, &seen).await;
    let id = rt
        .start_saga("business_travel", &json!({ "fail": "expense" }))
        .await
        .unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Compensated);
    let child = child_of(&rt, id).await;
    assert_eq!(child.state, SagaState::Compensated);
    let seen = seen.lock().unwrap().clone();
    let undos: Vec<&str> = seen
        .iter()
        .filter(|(_, _, undo)| *undo)
        .map(|(d, _, _)| d.as_str())
        .collect();
    assert_eq!(undos, ["expense", "hotel", "flight", "visa"], "{seen:?}");
    let mut once = seen.clone();
    once.sort();
    once.dedup();
    assert_eq!(once.len(), seen.len(), "an effect twice: {seen:?}");
    let steps = query::steps(rt.store(), child.id).await.unwrap();
    assert!(
        steps.iter().all(|s| s.compensated_at_ms.is_some()),
        "the child's own ledger records the undo: {steps:?}"
    );
    rt.shutdown().await;
}
both_backends!(
    undone_tests,
    a_booked_trip_is_undone_when_its_parent_turns_back
);
