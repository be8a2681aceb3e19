//! Sagas whose steps are a plan made at run time (`PlannedSaga`), on both backends:
//! a plan given at start runs in order and compensates in reverse with undos built from
//! the steps' results; it survives a restart of its process (the plan is stored with
//! the saga); a plan that breaks the rules is a typed error that writes nothing; a
//! planner step's answer (prose around JSON) becomes the plan, and an answer that is
//! not a valid plan fails the saga with the reason; a plan's waits take signals.

mod checks;
#[path = "../support/gated.rs"]
mod gated;
mod runs;
#[path = "../support/settle.rs"]
mod settle;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga_core::both_backends;
use agentsaga_core::testing::{Backend, fresh_url, wait_until};
use agentsaga_runtime::{Runtime, StepError};
use agentsaga_saga::query::{self, ListFilter};
use agentsaga_saga::{
    Error as SagaError, Plan, PlanStart, PlanStep, PlannedSaga, SagaDefinition, SagaState, Signal,
};
use gated::{Answer, Gates, assert_signal_refused};
use serde_json::{Value, json};
use settle::{assert_error_contains, settle};

/// One agent per destination, gated ([`Gated`]), answering: `{"fail": …}` fails
/// fatally, `calendar` answers an event id, `planner` answers the text in `plan_text`,
/// the others echo the command.
fn worker(plan_text: &Arc<Mutex<String>>) -> Answer {
    let plan_text = Arc::clone(plan_text);
    Arc::new(move |ctx, destination, cmd, n| {
        if let Some(why) = cmd.get("fail") {
            return Err(StepError::fatal(format!("refused: {why}")));
        }
        Ok(match destination {
            "calendar" if !ctx.is_compensation() => json!({ "event_id": format!("ev-{n}") }),
            "planner" => json!(plan_text.lock().unwrap().clone()),
            _ => cmd,
        })
    })
}

const DESTINATIONS: [&str; 4] = ["search", "calendar", "mail", "planner"];

fn errand() -> SagaDefinition {
    PlannedSaga::builder("errand", 1)
        .destinations(["search", "calendar", "mail"])
        .build()
        .unwrap()
}

fn assistant() -> SagaDefinition {
    agentsaga_saga::testing::planned_by_planner("assistant")
}

struct World {
    rt: Runtime,
    gates: Gates,
    plan_text: Arc<Mutex<String>>,
}

/// `errand` and `assistant`, and a gated [`worker`] for each of [`DESTINATIONS`].
async fn start_runtime(gates: &Gates, plan_text: &Arc<Mutex<String>>) -> Runtime {
    let b = gates.agents(&DESTINATIONS, &worker(plan_text));
    b.saga(errand()).saga(assistant()).start().await.unwrap()
}

async fn world(backend: Backend, open: bool) -> World {
    let gates = Gates::new(fresh_url(backend).await, open);
    let plan_text = Arc::new(Mutex::new(String::new()));
    let rt = start_runtime(&gates, &plan_text).await;
    World {
        rt,
        gates,
        plan_text,
    }
}

fn seen(w: &World) -> Vec<(String, Value)> {
    w.gates.seen()
}

/// Search, then two bookings in parallel, then a third, then the pivot (which fails
/// when `fail`). Each booking is undone by the event id its reply gave.
fn errand_plan(fail: bool) -> Plan {
    let book = |name: &str, about: Value| {
        PlanStep::command(name, "calendar", json!({ "book": about })).compensate(
            "calendar",
            json!({ "cancel": { "$from": format!("/results/{name}/event_id") } }),
        )
    };
    let mut send = json!({ "to": { "$from": "/input/to" } });
    if fail {
        send["fail"] = json!("mailbox full");
    }
    Plan::new()
        .then(
            PlanStep::command(
                "look",
                "search",
                json!({ "q": { "$from": "/input/topic" } }),
            )
            .nothing_to_undo(),
        )
        .parallel([
            book("book_a", json!({ "$from": "/results/look/q" })),
            book("book_b", json!("b")),
        ])
        .then(book("book_c", json!("c")))
        .then(PlanStep::command("send", "mail", send).pivot())
}

fn errand_start(fail: bool) -> PlanStart {
    PlanStart::new(
        errand_plan(fail),
        json!({ "topic": "sagas", "to": "ann@example.com" }),
    )
    .unwrap()
}
