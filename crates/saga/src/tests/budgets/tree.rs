//! A child saga spends against its root's budget as it spends, not once it answers.

use super::*;

/// A child of three undoable steps one after the other (`s0`, `s1`, `s2`), no budget
/// of its own.
fn spender() -> SagaDefinition {
    let undoable = |n: &str| {
        Step::<D>::new(n, format!("{n}-agent"))
            .command(|d: &D| d.clone())
            .compensate(format!("{n}-agent"), |_: &D| json!("undo"))
            .retry(fast())
    };
    Saga::<D>::builder("spender", 1)
        .step(undoable("s0"))
        .step(undoable("s1"))
        .step(undoable("s2"))
        .build()
        .unwrap()
}

/// A root whose one step is a `spender` child, at most 2 outside calls.
fn root(on_spent: OnBudgetSpent) -> SagaDefinition {
    Saga::<D>::builder("root", 1)
        .step(Step::saga("spend", "spender").command(|d: &D| d.clone()))
        .budget(Budget::new().calls(2), on_spent)
        .build()
        .unwrap()
}

// Each of the child's steps makes one outside call. Once `s0` and `s1` spent the
// root's 2 calls, the child sends no `s2`: by the root's budget it compensates (the
// root's step fails, and the root compensates). Before, the child, with no budget of
// its own, ran all three, and the root learnt of it when the child answered.
async fn a_child_stops_once_its_roots_budget_is_spent(backend: Backend) {
    let mut w = World::new(backend, vec![spender(), root(OnBudgetSpent::Compensate)], 7).await;
    w.usage = Usage::default().with_calls(1);
    let id = w.start("root", json!({ "trip": 1 })).await;
    let child = crate::engine::child_id(id, 0);
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    assert_eq!(of(&w.ledger.done, child), [0, 1], "no s2");
    assert_eq!(of(&w.ledger.undone, child), [1, 0]);
    let c = query::get(&w.store, child).await.unwrap().unwrap();
    assert_eq!(c.state, SagaState::Compensated);
    let error = c.error.unwrap_or_default();
    assert!(error.contains("budget spent: calls 2 of 2"), "{error}");
    let r = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(r.state, SagaState::Compensated, "{:?}", r.error);
    assert_eq!(spending(&w, id).await.usage.calls, 2);
}
both_backends!(
    child_root_tests,
    a_child_stops_once_its_roots_budget_is_spent
);

// With `Wait`, the child holds `s2` for the root's spent budget; a raise of the
// root's budget wakes the child, which goes on: everything completes.
async fn a_raise_of_the_root_wakes_its_held_child(backend: Backend) {
    let mut w = World::new(backend, vec![spender(), root(OnBudgetSpent::Wait)], 7).await;
    w.usage = Usage::default().with_calls(1);
    let id = w.start("root", json!({ "trip": 1 })).await;
    let child = crate::engine::child_id(id, 0);
    let store = w.store.clone();
    w.pump_until(
        "the child waits for a raise",
        async || {
            query::spending(&store, child)
                .await
                .unwrap()
                .is_some_and(|s| s.waiting_for_raise)
        },
        |_, _, _| Some(ok()),
        |_, _| ok(),
    )
    .await;
    assert_eq!(of(&w.ledger.done, child), [0, 1], "s2 held");
    raise(&w, &w.engine, id, Budget::new().calls(10)).await;
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    let r = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(r.state, SagaState::Completed, "{:?}", r.error);
    assert_eq!(of(&w.ledger.done, child), [0, 1, 2]);
    assert_eq!(spending(&w, id).await.usage.calls, 3);
}
both_backends!(root_raise_tests, a_raise_of_the_root_wakes_its_held_child);

// A re-planning child (`replan_on_failure`, five turns) whose planner plans one
// booking each turn, and every booking fails: each planner turn and booking makes one
// outside call. The root's 4 calls are spent after two turns: the child asks its
// planner no more and compensates. Before, it re-planned until out of turns, 10 calls
// against the root's 4.
async fn a_replanning_child_stops_once_its_roots_budget_is_spent(backend: Backend) {
    use super::super::recovery::careful;
    use super::super::replanning::{answers, plan_json, undoable};
    let root = Saga::<D>::builder("root", 1)
        .step(Step::saga("think", "careful").command(|_: &D| json!({ "topic": "x" })))
        .budget(Budget::new().calls(4), OnBudgetSpent::Compensate)
        .build()
        .unwrap();
    let turns: Vec<(String, String)> = (1..=5)
        .map(|t| {
            let plan = if t == 1 {
                "plan".into()
            } else {
                format!("plan_{t}")
            };
            (plan, format!("book{t}"))
        })
        .collect();
    let plans: Vec<(&str, Value)> = turns
        .iter()
        .map(|(plan, book)| {
            let step = undoable(book, "book", None);
            (plan.as_str(), plan_json(Plan::new().then(step)))
        })
        .collect();
    let by_turn = answers(&plans);
    let mut w = World::new(backend, vec![careful(5), root], 7).await;
    w.usage = Usage::default().with_calls(1);
    let id = w.start("root", json!({ "trip": 1 })).await;
    w.pump(
        &[id],
        |_, env, _| {
            let step = env.header(protocol::STEP_NAME).unwrap_or_default();
            Some(match by_turn.get(step) {
                Some(answer) => StepOutcome::Ok(answer.clone()),
                None => StepOutcome::Fatal("fully booked".into()),
            })
        },
        |_, _| ok(),
    )
    .await;
    let child = crate::engine::child_id(id, 0);
    let c = query::get(&w.store, child).await.unwrap().unwrap();
    assert_eq!(c.state, SagaState::Compensated, "{:?}", c.error);
    let error = c.error.unwrap_or_default();
    assert!(error.contains("budget spent: calls 4 of 4"), "{error}");
    assert_eq!(spending(&w, child).await.usage.calls, 4, "two turns");
    let r = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(r.state, SagaState::Compensated, "{:?}", r.error);
    assert_eq!(spending(&w, id).await.usage.calls, 4);
}
both_backends!(
    replanning_child_tests,
    a_replanning_child_stops_once_its_roots_budget_is_spent
);

/// Claims and handles what waits for `destination` (an orchestrator's or a child
/// start's).
async fn handle_all(w: &World, destination: &str) {
    for env in claim_of(&w.store, destination).await {
        let mut tx = w.store.begin().await.unwrap();
        w.engine.handle(&mut tx, &env).await.unwrap();
        tx.commit().await.unwrap();
        w.store
            .queue()
            .mark_delivered("t", &[env.seq])
            .await
            .unwrap();
    }
}

// A child with no budget of its own, past its pivot: `y` spends the rest of the root's
// budget, then `x`'s command is dead-lettered and its resend held for the root's
// spent budget. Re-driving that dead letter is refused: it is moot, saying why.
async fn a_dead_letter_held_for_the_roots_budget_is_not_redriven(backend: Backend) {
    let open = |n: &str| Step::<D>::new(n, format!("{n}-agent")).retry(fast());
    let kid = Saga::<D>::builder("kid", 1)
        .pivot(open("p"))
        .parallel([open("x"), open("y")])
        .build()
        .unwrap();
    let root = Saga::<D>::builder("root", 1)
        .pivot(
            Step::saga("k", "kid")
                .forward_only()
                .command(|d: &D| d.clone()),
        )
        .budget(Budget::new().calls(3), OnBudgetSpent::Wait)
        .build()
        .unwrap();
    let w = World::new(backend, vec![kid, root], 7).await;
    w.start("root", json!({ "trip": 1 })).await;
    handle_all(&w, "saga.kid.child").await;
    let p = claim_of(&w.store, "p-agent").await.remove(0);
    answer_and_handle_for(&w, &p, (ok(), 1), "saga.kid.v1").await;
    let x = claim_of(&w.store, "x-agent").await.remove(0);
    let y = claim_of(&w.store, "y-agent").await.remove(0);
    answer_and_handle_for(&w, &y, (ok(), 2), "saga.kid.v1").await;
    let reason = "x-agent: attempts exhausted";
    let notice = agentsaga_core::DeliveryFailed::notice_for(&x, reason).unwrap();
    let dead = agentsaga_core::queue::DeadLetter {
        seq: x.seq,
        reason: reason.into(),
        notice,
    };
    w.store.queue().dead_letter("t", &[dead]).await.unwrap();
    handle_all(&w, "saga.kid.v1").await;
    let why = Engine::moot(&w.store, &x)
        .await
        .unwrap()
        .unwrap_or_default();
    assert!(why.contains("budget"), "{why}");
}
both_backends!(
    held_by_root_tests,
    a_dead_letter_held_for_the_roots_budget_is_not_redriven
);
