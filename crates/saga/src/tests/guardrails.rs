//! Guardrails declared once per planned saga: `PlannedBuilder::max_steps` (a plan
//! with more steps is refused, at start and from a planner's reply) and
//! `PlannedBuilder::approve_before` (a command to such a destination waits for a
//! person's approval of the very command it sends, whatever the plan says).

use super::*;
use crate::{Signal, SignalSender};

/// A planned saga allowing at most 2 steps, with or without a planner step.
fn capped(planner: bool) -> SagaDefinition {
    let mut b = PlannedSaga::builder("capped", 1)
        .destinations(["search", "mail"])
        .max_steps(2)
        .retry(fast());
    if planner {
        b = b.planner(
            Step::new("plan", "planner")
                .command(|d: &Value| d["input"].clone())
                .nothing_to_undo(),
        );
    }
    b.build().unwrap()
}

/// Three steps: one over `capped`'s limit.
fn three_steps() -> Plan {
    Plan::new()
        .then(PlanStep::command("a", "search", json!(1)).nothing_to_undo())
        .parallel([
            PlanStep::command("b", "search", json!(2)).nothing_to_undo(),
            PlanStep::wait_for("c", "go"),
        ])
}

const TOO_MANY: &str =
    "the plan has 3 steps; this saga allows at most 2 (PlannedBuilder::max_steps)";

// At start: refused with the reason, nothing stored; `check_plan` says the same.
async fn max_steps_refuses_a_plan_at_start(backend: Backend) {
    let w = World::new(backend, vec![capped(false)], 40).await;
    let start = PlanStart::new(three_steps(), Value::Null).unwrap();
    let mut tx = w.store.begin().await.unwrap();
    let err = w.engine.start(&mut tx, "capped", &start).await.unwrap_err();
    tx.rollback().await.unwrap();
    assert!(
        matches!(&err, Error::InvalidPlan(why) if why == TOO_MANY),
        "{err:?}"
    );
    let all = query::list(&w.store, &query::ListFilter::default())
        .await
        .unwrap();
    assert!(all.is_empty(), "nothing started: {all:?}");
    let def = capped(false);
    assert!(
        matches!(def.check_plan(&three_steps()), Err(Error::InvalidPlan(why)) if why == TOO_MANY)
    );
    // Two steps are within the limit.
    let two = Plan::new()
        .then(PlanStep::command("a", "search", json!(1)).nothing_to_undo())
        .then(PlanStep::command("b", "mail", json!(2)).pivot());
    def.check_plan(&two).unwrap();
}
both_backends!(max_steps_start_tests, max_steps_refuses_a_plan_at_start);

// From the planner: its step fails, fatally, with the reason; the saga compensates
// (nothing to undo) and no step of the plan is sent.
async fn max_steps_refuses_a_planner_reply(backend: Backend) {
    let mut w = World::new(backend, vec![capped(true)], 41).await;
    let id = w.start("capped", json!({ "topic": "x" })).await;
    let plan = serde_json::to_value(three_steps()).unwrap();
    let mut sent = Vec::new();
    w.pump(
        &[id],
        |_, env, _| {
            sent.push(env.destination.clone());
            Some(StepOutcome::Ok(plan.clone()))
        },
        |_, _| ok(),
    )
    .await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    let error = s.error.unwrap_or_default();
    assert!(error.contains(TOO_MANY), "{error}");
    assert_eq!(sent, ["planner"], "no step of the refused plan ran");
    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0].state, StepState::Failed);
    assert!(
        steps[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains(TOO_MANY)),
        "{steps:?}"
    );
    let data = query::data(&w.store, id).await.unwrap().unwrap();
    assert!(
        data["plan"].is_null(),
        "the refused plan is not stored: {data}"
    );
}
both_backends!(max_steps_planner_tests, max_steps_refuses_a_planner_reply);

/// A planned saga whose payments need a person's approval.
pub(super) fn shop() -> SagaDefinition {
    PlannedSaga::builder("shop", 1)
        .destinations(["search", "pay", "mail"])
        .approve_before(["pay"])
        .retry(fast())
        .build()
        .unwrap()
}

/// Find an item, pay for it (references to the input and the find's result), mail:
/// no wait declared anywhere.
pub(super) fn shopping() -> PlanStart {
    let plan = Plan::new()
        .then(
            PlanStep::command("find", "search", json!({ "q": { "$from": "/input/want" } }))
                .compensate("search", json!("forget")),
        )
        .then(
            PlanStep::command(
                "charge",
                "pay",
                json!({
                    "amount": { "$from": "/input/amount" },
                    "item": { "$from": "/results/find/item" },
                }),
            )
            .compensate(
                "pay",
                json!({ "refund": { "$from": "/results/charge/id" } }),
            ),
        )
        .then(PlanStep::command("mail", "mail", json!("bought")).pivot());
    PlanStart::new(plan, json!({ "want": "lamp", "amount": 30 })).unwrap()
}

/// What `find` answers; every other command `{"id": "c-1"}`.
pub(super) fn shop_agent(env: &Envelope) -> StepOutcome {
    if env.destination == "search" {
        StepOutcome::Ok(json!({ "item": "lamp-7" }))
    } else {
        StepOutcome::Ok(json!({ "id": "c-1" }))
    }
}

/// Delivers until saga `id` waits for `signal`, answering commands with
/// [`shop_agent`]; returns the destinations and payloads of the commands sent.
pub(super) async fn pump_until_waiting(
    w: &mut World,
    id: SagaId,
    signal: &str,
) -> Vec<(String, Value)> {
    let (store, destinations) = (w.store.clone(), w.destinations.clone());
    let mut sent = Vec::new();
    testing::pump(
        &store,
        &destinations,
        "the saga waits for its approval",
        Duration::from_secs(60),
        async || {
            let s = query::get(&store, id).await.unwrap().unwrap();
            s.waiting_for.as_deref() == Some(signal)
        },
        async |batch| {
            for env in batch.iter() {
                if !env.destination.starts_with("saga.") {
                    sent.push((
                        env.destination.clone(),
                        serde_json::from_str(&env.payload).unwrap(),
                    ));
                }
                w.deliver(env, &mut |_, env, _| Some(shop_agent(env)), &mut |_, _| {
                    ok()
                })
                .await;
            }
        },
    )
    .await;
    sent
}

pub(super) async fn signal(
    w: &World,
    id: SagaId,
    sender: SignalSender,
    s: Signal,
) -> crate::Result<()> {
    let mut tx = w.store.begin().await.unwrap();
    let got = Engine::signal_by(&mut tx, id, "approve.charge", s, sender).await;
    tx.commit().await.unwrap();
    got.map(drop)
}

// The plan declares no wait; the engine inserts `approve.charge` before the payment.
// Nothing reaches `pay` before the signal; the wait shows the command with its
// references resolved (in the data, where `sagas show` and the console show it); no
// approval is taken before it is shown, nor from an agent; approved, the step sends
// exactly the recorded command.
async fn approve_before_holds_the_command_until_approved(backend: Backend) {
    let mut w = World::new(backend, vec![shop()], 42).await;
    let id = w
        .start("shop", serde_json::to_value(shopping()).unwrap())
        .await;
    let early = signal(&w, id, SignalSender::Person, Signal::Approve(json!("yes"))).await;
    assert!(
        matches!(&early, Err(Error::SignalRefused { reason, .. }) if reason.contains("only once the saga waits for it")),
        "no approval before the command is there to see: {early:?}"
    );

    let sent = pump_until_waiting(&mut w, id, "approve.charge").await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].0, "search");
    let data = query::data(&w.store, id).await.unwrap().unwrap();
    let expected = json!({ "amount": 30, "item": "lamp-7" });
    assert_eq!(
        data["results"]["approve.charge"],
        json!({
            "step": "charge",
            "destination": "pay",
            "command": expected,
            "compensation": {
                "destination": "pay",
                "command": { "refund": { "$from": "/results/charge/id" } },
            },
        }),
        "{data}"
    );
    let stored: Vec<&str> = data["plan"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(stored, ["find", "approve.charge", "charge", "mail"]);
    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(steps[1].name, "approve.charge");
    assert_eq!(steps[1].destination, "signal:approve.charge");
    assert_eq!(steps[1].state, StepState::Dispatched);

    let by_agent = signal(&w, id, SignalSender::Agent, Signal::Approve(json!("yes"))).await;
    assert!(
        matches!(by_agent, Err(Error::SignalRefused { .. })),
        "a person's decision: {by_agent:?}"
    );
    signal(&w, id, SignalSender::Person, Signal::Approve(json!("ann")))
        .await
        .unwrap();
    let mut paid = Vec::new();
    w.pump(
        &[id],
        |_, env, _| {
            if env.destination == "pay" {
                paid.push(serde_json::from_str::<Value>(&env.payload).unwrap());
            }
            Some(shop_agent(env))
        },
        |_, _| ok(),
    )
    .await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
    assert_eq!(paid, [expected], "exactly the approved command");
    let data = query::data(&w.store, id).await.unwrap().unwrap();
    assert_eq!(data["results"]["approve.charge"]["approved"], "ann");
}
both_backends!(
    approve_before_tests,
    approve_before_holds_the_command_until_approved
);

// Rejected: the wait fails as any rejected wait does; nothing reaches `pay`, and the
// saga compensates what came before (the find).
async fn approve_before_rejected_compensates(backend: Backend) {
    let mut w = World::new(backend, vec![shop()], 43).await;
    let id = w
        .start("shop", serde_json::to_value(shopping()).unwrap())
        .await;
    pump_until_waiting(&mut w, id, "approve.charge").await;
    signal(
        &w,
        id,
        SignalSender::Person,
        Signal::Reject("too dear".into()),
    )
    .await
    .unwrap();
    let mut sent = Vec::new();
    w.pump(
        &[id],
        |_, env, _| {
            sent.push(env.destination.clone());
            Some(shop_agent(env))
        },
        |_, _| ok(),
    )
    .await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    assert!(
        s.error.as_deref().unwrap_or_default().contains("too dear"),
        "{s:?}"
    );
    assert!(sent.is_empty(), "no command after the rejection: {sent:?}");
    assert_eq!(w.ledger.done, [(id, 0)], "only the find ran");
    assert_eq!(w.ledger.undone, [(id, 0)], "and is undone");
}
both_backends!(
    approve_before_reject_tests,
    approve_before_rejected_compensates
);
