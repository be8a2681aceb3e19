//! Budgets (`SagaBuilder::budget`): what agents report they used is added to the step
//! and the saga with the reply; once the budget is spent no further forward step goes
//! out, and the saga compensates or waits for an operator to raise it.

use super::*;
use crate::{Budget, OnBudgetSpent, Usage};

mod tree;

/// Three undoable steps one after the other (`a`, `b`, `c`), at most 150 tokens out.
fn thrifty(on_spent: OnBudgetSpent) -> SagaDefinition {
    let undoable = |n: &str| {
        Step::<D>::new(n, format!("{n}-agent"))
            .command(|d: &D| d.clone())
            .compensate(format!("{n}-agent"), |_: &D| json!("undo"))
            .retry(fast())
    };
    Saga::<D>::builder("thrifty", 1)
        .step(undoable("a"))
        .step(undoable("b"))
        .step(undoable("c"))
        .budget(Budget::new().tokens_out(150), on_spent)
        .build()
        .unwrap()
}

async fn spending(w: &World, id: SagaId) -> query::Spending {
    query::spending(&w.store, id).await.unwrap().unwrap()
}

/// A person raises saga `id`'s budget to `to`, with `engine`.
async fn raise(w: &World, engine: &Engine, id: SagaId, to: Budget) -> SagaState {
    let mut tx = w.store.begin().await.unwrap();
    let state = engine.raise_budget(&mut tx, id, to).await.unwrap();
    tx.commit().await.unwrap();
    state
}

/// `command` answered `ok` with a usage header that does not parse, and the reply
/// handled by the saga's orchestrator (`orchestrator`).
async fn answer_with_a_bad_usage(w: &World, command: &Envelope, orchestrator: &str) {
    let reply = protocol::reply(command, &ok())
        .unwrap()
        .unwrap()
        .header(protocol::USAGE, "{\"tokens\":3}");
    let mut tx = w.store.begin().await.unwrap();
    tx.enqueue(&reply).await.unwrap();
    tx.commit().await.unwrap();
    let env = claim_of(&w.store, orchestrator).await.remove(0);
    let mut tx = w.store.begin().await.unwrap();
    w.engine.handle(&mut tx, &env).await.unwrap();
    tx.commit().await.unwrap();
}

async fn waiting_for_raise(w: &mut World, id: SagaId, agent: impl Fn(usize, u32) -> StepOutcome) {
    let store = w.store.clone();
    let attempts = std::cell::Cell::new(0u32);
    w.pump_until(
        "the saga waits for a raise",
        async || {
            query::spending(&store, id)
                .await
                .unwrap()
                .unwrap()
                .waiting_for_raise
        },
        |_, _, step| {
            if step == 1 {
                attempts.set(attempts.get() + 1);
            }
            Some(agent(step, attempts.get()))
        },
        |_, _| ok(),
    )
    .await;
}

// Each command's reply uses 100 tokens out: after `a` 100 are spent, after `b` 200 of
// 150. `c` is never dispatched; `b` and `a` are undone, latest first; the usage shows
// per step and for the saga.
async fn a_spent_budget_compensates(backend: Backend) {
    let mut w = World::new(backend, vec![thrifty(OnBudgetSpent::Compensate)], 7).await;
    w.usage = Usage::tokens(40, 100);
    let id = w.start("thrifty", json!({ "trip": 1 })).await;
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    let error = s.error.unwrap_or_default();
    assert!(
        error.contains("budget spent: tokens_out 200 of 150"),
        "{error}"
    );
    assert_eq!(of(&w.ledger.done, id), [0, 1]);
    assert_eq!(of(&w.ledger.undone, id), [1, 0]);
    let spent = spending(&w, id).await;
    assert_eq!(spent.usage, Usage::tokens(80, 200));
    assert_eq!(spent.budget, Some(Budget::new().tokens_out(150)));
    assert!(!spent.waiting_for_raise);
    let steps = query::steps(&w.store, id).await.unwrap();
    let used: Vec<Usage> = steps.iter().map(|s| s.usage).collect();
    assert_eq!(used, [Usage::tokens(40, 100), Usage::tokens(40, 100)]);
}
both_backends!(compensate_tests, a_spent_budget_compensates);

// With `Wait`, the saga holds what it would dispatch next (the next stage after `b`
// succeeded; `b`'s retry after it failed retryably), says why, and waits. A raise that
// leaves the budget spent changes nothing; one that leaves room lets the held dispatch
// go, from an engine with the definition or (as the CLI) without it.
async fn a_spent_budget_waits_for_a_raise(backend: Backend) {
    for (retry, raiser_has_definition) in [(false, true), (true, true), (false, false)] {
        let mut w = World::new(backend, vec![thrifty(OnBudgetSpent::Wait)], 7).await;
        w.usage = Usage::tokens(0, 100);
        let id = w.start("thrifty", json!({ "trip": 1 })).await;
        waiting_for_raise(&mut w, id, |step, attempt| {
            if retry && step == 1 && attempt == 1 {
                StepOutcome::Retryable("rate limited".into())
            } else {
                ok()
            }
        })
        .await;
        let s = query::get(&w.store, id).await.unwrap().unwrap();
        assert_eq!(s.state, SagaState::Running);
        let error = s.error.unwrap_or_default();
        assert!(
            error.contains("budget spent: tokens_out 200 of 150: waiting for an operator"),
            "{error}"
        );
        let steps = query::steps(&w.store, id).await.unwrap();
        assert_eq!(steps.len(), 2, "`c` is not dispatched");
        assert_eq!(steps[1].attempts, 1, "no retry of `b` went out");
        let stats = w.store.admin().stats().await.unwrap();
        assert_eq!(
            (stats.pending, stats.in_flight),
            (0, 0),
            "nothing on its way"
        );

        let raiser = if raiser_has_definition {
            Engine::new([thrifty(OnBudgetSpent::Wait)]).unwrap()
        } else {
            Engine::new(Vec::<SagaDefinition>::new()).unwrap()
        };
        let to = |n: u64| Budget::new().tokens_out(n);
        assert_eq!(raise(&w, &raiser, id, to(200)).await, SagaState::Running);
        assert!(spending(&w, id).await.waiting_for_raise, "still spent");
        raise(&w, &raiser, id, to(1_000)).await;
        w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
        let s = query::get(&w.store, id).await.unwrap().unwrap();
        assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
        assert_eq!(of(&w.ledger.done, id), [0, 1, 2]);
        let spent = spending(&w, id).await;
        assert_eq!(spent.usage.tokens_out, if retry { 400 } else { 300 });
        assert_eq!(spent.budget, Some(Budget::new().tokens_out(1_000)));
        assert!(!spent.waiting_for_raise);
    }
}
both_backends!(wait_tests, a_spent_budget_waits_for_a_raise);

// A finished saga's budget is not raised: refused, saying why.
async fn a_finished_saga_is_not_raised(backend: Backend) {
    let mut w = World::new(backend, vec![thrifty(OnBudgetSpent::Compensate)], 7).await;
    let id = w.start("thrifty", json!({ "trip": 1 })).await;
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    let mut tx = w.store.begin().await.unwrap();
    let err = w
        .engine
        .raise_budget(&mut tx, id, Budget::new().calls(9))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WrongState { .. }), "{err}");
    assert_eq!(spending(&w, id).await.usage, Usage::default());
}
both_backends!(finished_tests, a_finished_saga_is_not_raised);

// A reply whose usage does not parse fails its step, saying why: the saga compensates.
async fn a_malformed_usage_fails_its_step(backend: Backend) {
    let w = World::new(backend, vec![thrifty(OnBudgetSpent::Compensate)], 7).await;
    let id = w.start("thrifty", json!({ "trip": 1 })).await;
    let command = claim_of(&w.store, "a-agent").await.remove(0);
    answer_with_a_bad_usage(&w, &command, "saga.thrifty.v1").await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensating);
    let error = s.error.unwrap_or_default();
    assert!(error.contains("usage header"), "{error}");
}
both_backends!(malformed_tests, a_malformed_usage_fails_its_step);

// What a child saga used counts for its parent's step and its parent: the child's
// answer carries it.
async fn a_childs_usage_counts_for_its_parent(backend: Backend) {
    use super::children::{booking, travel};
    let mut w = World::new(backend, vec![booking(), travel()], 3).await;
    w.usage = Usage::tokens(0, 10).with_calls(1);
    let parent = w.start("travel", json!({"trip": 7})).await;
    let child = crate::engine::child_id(parent, 1);
    w.pump(&[parent], |_, _, _| Some(ok()), |_, _| ok()).await;
    let each = Usage::tokens(0, 10).with_calls(1);
    assert_eq!(
        spending(&w, child).await.usage,
        each + each,
        "flight, hotel"
    );
    let steps = query::steps(&w.store, parent).await.unwrap();
    assert_eq!(
        steps.iter().map(|s| s.usage).collect::<Vec<_>>(),
        [each, each + each, each],
        "visa, the child, expense"
    );
    assert_eq!(spending(&w, parent).await.usage, each + each + each + each);
}
both_backends!(child_tests, a_childs_usage_counts_for_its_parent);

/// A pivot, then two steps in parallel (`x`, `y`), at most 3 outside calls, held when
/// spent.
fn after_the_pivot() -> SagaDefinition {
    let open = |n: &str| Step::<D>::new(n, format!("{n}-agent")).retry(fast());
    Saga::<D>::builder("after", 1)
        .pivot(open("p"))
        .parallel([open("x"), open("y")])
        .budget(Budget::new().calls(3), OnBudgetSpent::Wait)
        .build()
        .unwrap()
}

/// `command`'s agent answers `outcome`, reporting one outside call; the orchestrator
/// then handles every reply waiting for it.
async fn answer_and_handle(w: &World, command: &Envelope, outcome: StepOutcome) {
    answer_and_handle_for(w, command, (outcome, 1), "saga.after.v1").await;
}

/// [`answer_and_handle`], reporting `calls` outside calls, for the saga whose
/// orchestrator is `orchestrator`.
async fn answer_and_handle_for(
    w: &World,
    command: &Envelope,
    (outcome, calls): (StepOutcome, u64),
    orchestrator: &str,
) {
    let reply = protocol::reply(command, &outcome).unwrap().unwrap();
    let reply = protocol::with_usage(reply, &Usage::default().with_calls(calls));
    let mut tx = w.store.begin().await.unwrap();
    tx.receive(&command.destination, command.id).await.unwrap();
    tx.enqueue(&reply).await.unwrap();
    tx.commit().await.unwrap();
    let done = |seq: i64| {
        let store = w.store.clone();
        async move { store.queue().mark_delivered("t", &[seq]).await.unwrap() }
    };
    done(command.seq).await;
    for env in claim_of(&w.store, orchestrator).await {
        let mut tx = w.store.begin().await.unwrap();
        w.engine.handle(&mut tx, &env).await.unwrap();
        tx.commit().await.unwrap();
        done(env.seq).await;
    }
}

// Past the pivot, `x`'s retry is held for the spent budget, then `y` fails: the saga
// is stuck. A raise keeps what was held (the saga is stuck, not turned back); the
// operator's retry sends `y` again and `x`'s held retry, and the saga completes.
// (Before, the raise dropped `x`'s retry and the saga waited on it for ever.)
async fn a_raise_while_stuck_keeps_what_was_held(backend: Backend) {
    let w = World::new(backend, vec![after_the_pivot()], 7).await;
    let id = w.start("after", json!({ "trip": 1 })).await;
    let p = claim_of(&w.store, "p-agent").await.remove(0);
    answer_and_handle(&w, &p, ok()).await;
    let x = claim_of(&w.store, "x-agent").await.remove(0);
    let y = claim_of(&w.store, "y-agent").await.remove(0);
    let busy = (StepOutcome::Retryable("busy".into()), 2);
    answer_and_handle_for(&w, &x, busy, "saga.after.v1").await;
    assert!(
        spending(&w, id).await.waiting_for_raise,
        "x's retry is held"
    );
    answer_and_handle(&w, &y, StepOutcome::Fatal("no".into())).await;
    let state = |w: &World| {
        let store = w.store.clone();
        async move { query::get(&store, id).await.unwrap().unwrap().state }
    };
    assert_eq!(state(&w).await, SagaState::Stuck);

    raise(&w, &w.engine, id, Budget::new().calls(10)).await;
    assert!(
        claim_of(&w.store, "x-agent").await.is_empty(),
        "nothing sent while stuck"
    );
    let mut tx = w.store.begin().await.unwrap();
    w.engine.retry(&mut tx, id).await.unwrap();
    tx.commit().await.unwrap();
    let x = claim_of(&w.store, "x-agent").await;
    let y = claim_of(&w.store, "y-agent").await;
    assert_eq!((x.len(), y.len()), (1, 1), "y again, and x's held retry");
    answer_and_handle(&w, &x[0], ok()).await;
    answer_and_handle(&w, &y[0], ok()).await;
    assert_eq!(state(&w).await, SagaState::Completed);
    assert_eq!(spending(&w, id).await.usage.calls, 6);
}
both_backends!(stuck_raise_tests, a_raise_while_stuck_keeps_what_was_held);

// A late reply (its step was sent again since) with a usage header that does not
// parse is ignored as any late reply is: it does not fail the running saga. What a
// late reply used counts.
async fn a_late_reply_with_a_bad_usage_is_ignored(backend: Backend) {
    let w = World::new(backend, vec![after_the_pivot()], 7).await;
    let id = w.start("after", json!({ "trip": 1 })).await;
    let p = claim_of(&w.store, "p-agent").await.remove(0);
    answer_and_handle(&w, &p, ok()).await;
    let x = claim_of(&w.store, "x-agent").await.remove(0);
    answer_and_handle(&w, &x, StepOutcome::Retryable("busy".into())).await;
    // Raise, so that x's retry goes whatever it spent.
    raise(&w, &w.engine, id, Budget::new().calls(10)).await;
    // The first attempt's reply, again, late and with a bad header.
    answer_with_a_bad_usage(&w, &x, "saga.after.v1").await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Running, "{:?}", s.error);
}
both_backends!(
    late_bad_usage_tests,
    a_late_reply_with_a_bad_usage_is_ignored
);

// Past the pivot, `y` fails (the saga is stuck) while `x` is still on its way: `x`'s
// success is kept, and once the operator's retry of `y` succeeds the saga completes.
async fn a_sibling_answering_while_stuck_is_kept(backend: Backend) {
    let w = World::new(backend, vec![after_the_pivot()], 7).await;
    let id = w.start("after", json!({ "trip": 1 })).await;
    raise(&w, &w.engine, id, Budget::new().calls(100)).await;
    let p = claim_of(&w.store, "p-agent").await.remove(0);
    answer_and_handle(&w, &p, ok()).await;
    let x = claim_of(&w.store, "x-agent").await.remove(0);
    let y = claim_of(&w.store, "y-agent").await.remove(0);
    answer_and_handle(&w, &y, StepOutcome::Fatal("no".into())).await;
    answer_and_handle(&w, &x, ok()).await;
    let mut tx = w.store.begin().await.unwrap();
    w.engine.retry(&mut tx, id).await.unwrap();
    tx.commit().await.unwrap();
    let y = claim_of(&w.store, "y-agent").await.remove(0);
    answer_and_handle(&w, &y, ok()).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
}
both_backends!(sibling_tests, a_sibling_answering_while_stuck_is_kept);

// Past the pivot, `p` and `y` spend the budget (3 calls of 3), then `x`'s command is
// dead-lettered: its resend is held for the spent budget. Re-driving that dead letter
// would run the command the budget holds: it is moot, saying why. Once the budget is
// raised the saga sends `x` again itself (a later attempt), and the dead letter stays
// moot.
async fn a_dead_letter_held_for_a_spent_budget_is_not_redriven(backend: Backend) {
    let w = World::new(backend, vec![after_the_pivot()], 7).await;
    let id = w.start("after", json!({ "trip": 1 })).await;
    let p = claim_of(&w.store, "p-agent").await.remove(0);
    answer_and_handle(&w, &p, ok()).await;
    let x = claim_of(&w.store, "x-agent").await.remove(0);
    let y = claim_of(&w.store, "y-agent").await.remove(0);
    answer_and_handle_for(&w, &y, (ok(), 2), "saga.after.v1").await;
    let reason = "x-agent: attempts exhausted";
    let notice = agentsaga_core::DeliveryFailed::notice_for(&x, reason).unwrap();
    let dead = agentsaga_core::queue::DeadLetter {
        seq: x.seq,
        reason: reason.into(),
        notice,
    };
    w.store.queue().dead_letter("t", &[dead]).await.unwrap();
    for env in claim_of(&w.store, "saga.after.v1").await {
        let mut tx = w.store.begin().await.unwrap();
        w.engine.handle(&mut tx, &env).await.unwrap();
        tx.commit().await.unwrap();
    }
    assert!(
        spending(&w, id).await.waiting_for_raise,
        "x's resend is held"
    );
    let why = Engine::moot(&w.store, &x)
        .await
        .unwrap()
        .unwrap_or_default();
    assert!(why.contains("budget spent: calls 3 of 3"), "{why}");
    assert!(why.contains("raise"), "{why}");

    raise(&w, &w.engine, id, Budget::new().calls(10)).await;
    let again = claim_of(&w.store, "x-agent").await;
    assert_eq!(again.len(), 1, "the saga sent x again itself");
    assert!(Engine::moot(&w.store, &x).await.unwrap().is_some());
}
both_backends!(
    held_dead_letter_tests,
    a_dead_letter_held_for_a_spent_budget_is_not_redriven
);

/// One stage of four steps in parallel, at most 2 outside calls, held when spent.
fn wide() -> SagaDefinition {
    let open = |n: &str| {
        Step::<D>::new(n, format!("{n}-agent"))
            .nothing_to_undo()
            .retry(fast())
    };
    Saga::<D>::builder("wide", 1)
        .parallel([open("w0"), open("w1"), open("w2"), open("w3")])
        .budget(Budget::new().calls(2), OnBudgetSpent::Wait)
        .build()
        .unwrap()
}

/// The commands of `wide`'s steps waiting for their agents.
async fn wide_commands(w: &World) -> Vec<Envelope> {
    let mut all = Vec::new();
    for n in 0..4 {
        all.extend(claim_of(&w.store, &format!("w{n}-agent")).await);
    }
    all
}

// A parallel stage of four steps with room for two calls: two go out (each step on
// its way is expected to make one call), the others wait. Once the two answered with
// a call each, the budget is spent: the others are held for a raise; after it, they
// go, and the saga completes.
async fn a_parallel_stage_goes_out_as_far_as_it_fits(backend: Backend) {
    let w = World::new(backend, vec![wide()], 7).await;
    let id = w.start("wide", json!({ "trip": 1 })).await;
    let first = wide_commands(&w).await;
    assert_eq!(first.len(), 2, "only what fits goes out");
    for c in &first {
        answer_and_handle_for(&w, c, (ok(), 1), "saga.wide.v1").await;
    }
    assert!(wide_commands(&w).await.is_empty(), "the budget is spent");
    let spent = spending(&w, id).await;
    assert!(spent.waiting_for_raise, "the other two are held");
    assert_eq!(spent.usage.calls, 2);

    raise(&w, &w.engine, id, Budget::new().calls(10)).await;
    let rest = wide_commands(&w).await;
    assert_eq!(rest.len(), 2, "the held two go after the raise");
    for c in &rest {
        answer_and_handle_for(&w, c, (ok(), 1), "saga.wide.v1").await;
    }
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
    assert_eq!(spending(&w, id).await.usage.calls, 4);
}
both_backends!(
    parallel_fit_tests,
    a_parallel_stage_goes_out_as_far_as_it_fits
);
