//! Sagas whose steps are a plan made at run time (`PlannedSaga`), on both backends:
//! a plan given at start runs in order and compensates in reverse with undos built from
//! the steps' results; it survives a restart of its process (the plan is stored with
//! the saga); a plan that breaks the rules is a typed error that writes nothing; a
//! planner step's answer (prose around JSON) becomes the plan, and an answer that is
//! not a valid plan fails the saga with the reason; a plan's waits take signals.

mod checks;
mod runs;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga_core::both_backends;
use agentsaga_core::testing::{Backend, fresh_url, wait_until};
use agentsaga_runtime::{AgentContext, CallContext, CallingAgent, Runtime, StepError};
use agentsaga_saga::query::{self, ListFilter};
use agentsaga_saga::{
    Error as SagaError, Plan, PlanStart, PlanStep, PlannedSaga, SagaDefinition, SagaId, SagaState,
    Signal, Step,
};
use serde_json::{Value, json};
use tokio::sync::watch;

type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// One agent per destination: waits at a gate (outside any transaction), records the
/// command, and answers: `{"fail": …}` fails fatally, `calendar` answers an event id,
/// `planner` answers the text in `plan_text`, the others echo the command.
struct Worker {
    destination: &'static str,
    seen: Seen,
    gate: watch::Receiver<bool>,
    plan_text: Arc<Mutex<String>>,
}

#[async_trait::async_trait]
impl CallingAgent for Worker {
    type Command = Value;
    type Output = ();
    type Reply = Value;
    fn destination(&self) -> &str {
        self.destination
    }
    async fn call(&self, _: &CallContext<'_>, _: &Value) -> Result<(), StepError> {
        let _ = self.gate.clone().wait_for(|open| *open).await;
        Ok(())
    }
    async fn record(
        &self,
        ctx: &mut AgentContext<'_>,
        cmd: Value,
        (): (),
    ) -> Result<Value, StepError> {
        let n = {
            let mut seen = self.seen.lock().unwrap();
            seen.push((self.destination.to_owned(), cmd.clone()));
            seen.len()
        };
        if let Some(why) = cmd.get("fail") {
            return Err(StepError::fatal(format!("refused: {why}")));
        }
        Ok(match self.destination {
            "calendar" if !ctx.is_compensation() => json!({ "event_id": format!("ev-{n}") }),
            "planner" => json!(self.plan_text.lock().unwrap().clone()),
            _ => cmd,
        })
    }
}

const DESTINATIONS: [&str; 4] = ["search", "calendar", "mail", "planner"];

fn errand() -> SagaDefinition {
    PlannedSaga::builder("errand", 1)
        .destinations(["search", "calendar", "mail"])
        .build()
        .unwrap()
}

fn assistant() -> SagaDefinition {
    PlannedSaga::builder("assistant", 1)
        .destinations(["search", "calendar", "mail"])
        .planner(
            Step::new("plan", "planner")
                .command(|d: &Value| d["input"].clone())
                .nothing_to_undo(),
        )
        .build()
        .unwrap()
}

struct World {
    rt: Runtime,
    url: String,
    seen: Seen,
    open: watch::Sender<bool>,
    plan_text: Arc<Mutex<String>>,
}

async fn start_runtime(
    url: &str,
    seen: &Seen,
    gate: &watch::Receiver<bool>,
    plan_text: &Arc<Mutex<String>>,
) -> Runtime {
    let mut b = Runtime::builder()
        .database(url)
        .saga(errand())
        .saga(assistant());
    for destination in DESTINATIONS {
        b = b.calling_agent(Worker {
            destination,
            seen: Arc::clone(seen),
            gate: gate.clone(),
            plan_text: Arc::clone(plan_text),
        });
    }
    b.start().await.unwrap()
}

async fn world(backend: Backend, open: bool) -> World {
    let url = fresh_url(backend).await;
    let seen = Seen::default();
    let (tx, gate) = watch::channel(open);
    let plan_text = Arc::new(Mutex::new(String::new()));
    let rt = start_runtime(&url, &seen, &gate, &plan_text).await;
    World {
        rt,
        url,
        seen,
        open: tx,
        plan_text,
    }
}

async fn settle(rt: &Runtime, id: SagaId) -> SagaState {
    tokio::time::timeout(Duration::from_secs(30), rt.wait(id))
        .await
        .expect("the saga settles")
        .unwrap()
}

fn seen(w: &World) -> Vec<(String, Value)> {
    w.seen.lock().unwrap().clone()
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
