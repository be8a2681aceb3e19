//! Sagas whose steps are a plan made at run time (`PlannedSaga`), on both backends:
//! a plan given at start runs in order and compensates in reverse with undos built from
//! the steps' results; it survives a restart of its process (the plan is stored with
//! the saga); a plan that breaks the rules is a typed error that writes nothing; a
//! planner step's answer (prose around JSON) becomes the plan, and an answer that is
//! not a valid plan fails the saga with the reason; a plan's waits take signals.

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

// The plan runs in order, with its references resolved; the results land in the data.
async fn a_plan_runs(backend: Backend) {
    let w = world(backend, true).await;
    let id =
        w.rt.start_saga("errand", &errand_start(false))
            .await
            .unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Completed);
    let seen = seen(&w);
    assert_eq!(seen[0], ("search".into(), json!({ "q": "sagas" })));
    let calendar: Vec<&Value> = seen[1..3].iter().map(|(_, v)| v).collect();
    assert!(calendar.contains(&&json!({ "book": "sagas" })), "{seen:?}");
    assert!(calendar.contains(&&json!({ "book": "b" })), "{seen:?}");
    assert_eq!(seen[3], ("calendar".into(), json!({ "book": "c" })));
    assert_eq!(seen[4], ("mail".into(), json!({ "to": "ann@example.com" })));
    assert_eq!(seen.len(), 5);
    let data = query::data(w.rt.store(), id).await.unwrap().unwrap();
    assert_eq!(data["results"]["send"], json!({ "to": "ann@example.com" }));
    assert!(data["plan"]["steps"].is_array(), "the plan is stored");
    assert_eq!(data["input"]["topic"], "sagas");
}
both_backends!(runs_tests, a_plan_runs);

// The pivot fails: the bookings are undone in reverse (the later stage first, then
// the parallel group), each by the event id its own reply gave.
async fn a_failed_plan_compensates_in_reverse(backend: Backend) {
    let w = world(backend, true).await;
    let id =
        w.rt.start_saga("errand", &errand_start(true))
            .await
            .unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Compensated);
    let seen = seen(&w);
    let event = |step: &str| {
        let saga = seen
            .iter()
            .position(|(d, v)| d == "calendar" && v["book"] == json!(step));
        format!("ev-{}", saga.expect("booked") + 1)
    };
    let cancels: Vec<Value> = seen
        .iter()
        .filter(|(_, v)| v.get("cancel").is_some())
        .map(|(_, v)| v["cancel"].clone())
        .collect();
    assert_eq!(cancels.len(), 3, "{seen:?}");
    assert_eq!(
        cancels[0],
        json!(event("c")),
        "the last stage is undone first"
    );
    let group: Vec<&Value> = cancels[1..].iter().collect();
    assert!(group.contains(&&json!(event("sagas"))), "{cancels:?}");
    assert!(group.contains(&&json!(event("b"))), "{cancels:?}");
    let saga = query::get(w.rt.store(), id).await.unwrap().unwrap();
    assert!(
        saga.error
            .as_deref()
            .unwrap_or_default()
            .contains("mailbox full"),
        "{saga:?}"
    );
}
both_backends!(compensates_tests, a_failed_plan_compensates_in_reverse);

// The plan lives with the saga: a new process, which never saw it, resumes it.
async fn a_plan_survives_a_restart(backend: Backend) {
    let w = world(backend, false).await;
    let id =
        w.rt.start_saga("errand", &errand_start(true))
            .await
            .unwrap();
    let World {
        rt,
        url,
        seen,
        open,
        plan_text,
    } = w;
    // The first command is out (its agent waits at the gate); stop the process there.
    wait_until(
        "the search is dispatched",
        Duration::from_secs(30),
        async || {
            query::steps(rt.store(), id)
                .await
                .unwrap()
                .iter()
                .any(|st| st.name == "look")
        },
    )
    .await;
    rt.shutdown().await;
    open.send_replace(true);
    let gate = open.subscribe();
    let rt = start_runtime(&url, &seen, &gate, &plan_text).await;
    assert_eq!(settle(&rt, id).await, SagaState::Compensated);
    let cancels = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, v)| v.get("cancel").is_some())
        .count();
    assert_eq!(cancels, 3);
    rt.shutdown().await;
}
both_backends!(restart_tests, a_plan_survives_a_restart);

// Plans that break the rules are refused with the reason; nothing is written.
async fn invalid_plans_write_nothing(backend: Backend) {
    let w = world(backend, true).await;
    let before = w.rt.store().admin().stats().await.unwrap();
    let undone = |s: PlanStep| s.nothing_to_undo();
    let cases: Vec<(Value, &str)> = vec![
        (
            json!(
                PlanStart::new(
                    Plan::new().then(PlanStep::command("a", "search", Value::Null)),
                    Value::Null
                )
                .unwrap()
            ),
            "must say how to undo",
        ),
        (
            json!(
                PlanStart::new(
                    Plan::new().then(undone(PlanStep::command("a", "payments", Value::Null))),
                    Value::Null
                )
                .unwrap()
            ),
            "unknown destination `payments`",
        ),
        (
            json!(
                PlanStart::new(
                    Plan::new()
                        .then(undone(PlanStep::command("a", "search", Value::Null)))
                        .then(undone(PlanStep::command("a", "mail", Value::Null))),
                    Value::Null
                )
                .unwrap()
            ),
            "two steps are named `a`",
        ),
        (json!({ "topic": "no plan at all" }), "start it with a plan"),
        (
            json!({ "plan": { "steps": [{ "name": "a", "destination": "search", "run": "sh" }] } }),
            "unknown field `run`",
        ),
    ];
    for (start, why) in &cases {
        let err = w.rt.start_saga("errand", start).await.unwrap_err();
        assert!(
            matches!(&err, agentsaga_runtime::Error::Saga(SagaError::InvalidPlan(w)) if w.contains(why)),
            "{start}: {err}"
        );
    }
    // A batch with a valid plan first and an invalid one after is refused whole, before
    // anything is written: its transaction commits nothing of it.
    let valid = json!(
        PlanStart::new(
            Plan::new().then(undone(PlanStep::command("a", "search", Value::Null))),
            Value::Null
        )
        .unwrap()
    );
    let mut tx = w.rt.store().begin().await.unwrap();
    let err =
        w.rt.start_sagas_in(&mut tx, "errand", &[valid, cases[0].0.clone()])
            .await
            .unwrap_err();
    assert!(
        matches!(&err, agentsaga_runtime::Error::Saga(SagaError::InvalidPlan(w)) if w.contains(cases[0].1)),
        "{err}"
    );
    tx.commit().await.unwrap();
    let sagas = query::list(w.rt.store(), &ListFilter::default())
        .await
        .unwrap();
    assert!(sagas.is_empty(), "no saga written: {sagas:?}");
    let after = w.rt.store().admin().stats().await.unwrap();
    assert_eq!(
        (after.pending, after.in_flight, after.delivered, after.dead),
        (
            before.pending,
            before.in_flight,
            before.delivered,
            before.dead
        ),
        "no message written"
    );
    assert!(seen(&w).is_empty());
}
both_backends!(invalid_tests, invalid_plans_write_nothing);

// A planner's answer, prose around fenced JSON, becomes the plan; an answer that is
// not a valid plan fails the saga with the reason, and nothing of it runs.
async fn a_planner_chooses_the_steps(backend: Backend) {
    let w = world(backend, true).await;
    *w.plan_text.lock().unwrap() = format!(
        "Sure! Here is my plan:\n```json\n{}\n```\nLet me know.",
        serde_json::to_string_pretty(&errand_plan(false)).unwrap()
    );
    let input = json!({ "topic": "planning", "to": "bob@example.com" });
    let id = w.rt.start_saga("assistant", &input).await.unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Completed);
    let seen_ok = seen(&w);
    assert_eq!(seen_ok[0], ("planner".into(), input));
    assert_eq!(seen_ok[1], ("search".into(), json!({ "q": "planning" })));
    assert_eq!(seen_ok.last().unwrap().0, "mail");

    *w.plan_text.lock().unwrap() =
        r#"{"steps": [{"name": "pay", "destination": "payments", "nothing_to_undo": true}]}"#
            .into();
    let id =
        w.rt.start_saga("assistant", &json!({ "topic": "x" }))
            .await
            .unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Compensated);
    let saga = query::get(w.rt.store(), id).await.unwrap().unwrap();
    let error = saga.error.unwrap_or_default();
    assert!(
        error.contains("invalid plan") && error.contains("unknown destination `payments`"),
        "{error}"
    );
    assert_eq!(
        seen(&w).len(),
        seen_ok.len() + 1,
        "only the planner was asked"
    );

    *w.plan_text.lock().unwrap() = "I'm sorry, I cannot plan that.".into();
    let id =
        w.rt.start_saga("assistant", &json!({ "topic": "y" }))
            .await
            .unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Compensated);
    let saga = query::get(w.rt.store(), id).await.unwrap().unwrap();
    assert!(
        saga.error
            .as_deref()
            .unwrap_or_default()
            .contains("no JSON plan"),
        "{saga:?}"
    );
}
both_backends!(planner_tests, a_planner_chooses_the_steps);

// A plan's wait parks the saga until its signal; the payload lands in the results.
async fn a_plans_wait_takes_its_signal(backend: Backend) {
    let w = world(backend, true).await;
    let plan = Plan::new()
        .then(PlanStep::wait_for("approve", "approval"))
        .then(
            PlanStep::command(
                "send",
                "mail",
                json!({ "by": { "$from": "/results/approve/by" } }),
            )
            .pivot(),
        );
    let id =
        w.rt.start_saga("errand", &PlanStart::new(plan, Value::Null).unwrap())
            .await
            .unwrap();
    wait_until("the saga waits", Duration::from_secs(30), async || {
        query::get(w.rt.store(), id)
            .await
            .unwrap()
            .and_then(|s| s.waiting_for)
            .as_deref()
            == Some("approval")
    })
    .await;
    let err =
        w.rt.signal(id, "other", Signal::Approve(Value::Null))
            .await
            .unwrap_err();
    assert!(
        matches!(
            err,
            agentsaga_runtime::Error::Saga(SagaError::SignalRefused { .. })
        ),
        "{err}"
    );
    w.rt.signal(id, "approval", Signal::Approve(json!({ "by": "ops" })))
        .await
        .unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Completed);
    assert_eq!(seen(&w), [("mail".to_owned(), json!({ "by": "ops" }))]);
}
both_backends!(wait_tests, a_plans_wait_takes_its_signal);
