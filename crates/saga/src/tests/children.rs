//! Child sagas (`Step::saga`): a step that is a saga of its own. Its outcome is the
//! step's; a parent that turns back undoes a completed child as a whole, and aborts a
//! running one; one step has one child, however often its start is delivered; the
//! depth bound refuses a child with nothing of it written.

use super::*;
use crate::engine::child_id;

mod held;
mod plans;
mod property;

/// The child: two undoable reservations, no pivot.
pub(super) fn booking() -> SagaDefinition {
    let reserve = |n: &str, timeout: bool| {
        let step = Step::<D>::new(n, format!("{n}-agent"))
            .command(|d: &D| d.clone())
            .on_reply(move |d: &mut D, r: Value| {
                let k = format!("r{}", d.as_object().map_or(0, |o| o.len()));
                d[k] = r;
            })
            .compensate(format!("{n}-agent"), |d: &D| json!({"cancel": d["trip"]}))
            .retry(fast());
        if timeout {
            step.timeout(Duration::from_millis(300))
        } else {
            step
        }
    };
    Saga::<D>::builder("booking", 1)
        .step(reserve("flight", true))
        // No timeout: an agent that never answers leaves the child running.
        .step(reserve("hotel", false))
        .build()
        .unwrap()
}

/// The parent: a visa, the booking as a child saga (its data folded in), an expense.
pub(super) fn travel() -> SagaDefinition {
    let undoable = |n: &str| {
        Step::<D>::new(n, format!("{n}-agent"))
            .compensate(format!("{n}-agent"), |_: &D| json!("undo"))
            .retry(fast())
            .timeout(Duration::from_millis(300))
    };
    Saga::<D>::builder("travel", 1)
        .step(undoable("visa"))
        .step(
            Step::saga("book", "booking")
                .command(|d: &D| json!({"trip": d["trip"]}))
                .on_reply(|d: &mut D, booked: Value| d["booked"] = booked),
        )
        .step(undoable("expense"))
        .build()
        .unwrap()
}

async fn world(backend: Backend, seed: u64) -> World {
    World::new(backend, vec![booking(), travel()], seed).await
}

fn state(s: &Option<query::SagaSummary>) -> SagaState {
    s.as_ref().expect("the saga exists").state
}

// The child completes: the parent's step succeeds with the child's data, and the
// parent goes on. The child records its parent; the parent lists it as its child.
async fn a_child_completes(backend: Backend) {
    let mut w = world(backend, 1).await;
    let parent = w.start("travel", json!({"trip": 7})).await;
    let child = child_id(parent, 1);
    w.pump(&[parent], |_, _, _| Some(ok()), |_, _| ok()).await;
    assert_eq!(
        state(&query::get(&w.store, parent).await.unwrap()),
        SagaState::Completed
    );
    let c = query::get(&w.store, child)
        .await
        .unwrap()
        .expect("the child");
    assert_eq!(c.state, SagaState::Completed);
    assert_eq!(c.name, "booking");
    assert_eq!(c.parent_id, Some(parent));
    assert_eq!(of(&w.ledger.done, child), vec![0, 1]);
    assert_eq!(of(&w.ledger.done, parent), vec![0, 2], "visa, expense");
    let data = query::data(&w.store, parent).await.unwrap().unwrap();
    assert_eq!(
        data["booked"]["trip"], 7,
        "the child's data is the step's reply: {data}"
    );
    assert_eq!(data["booked"]["r1"], "ok", "{data}");
    let children = query::list(
        &w.store,
        &query::ListFilter {
            parent: Some(parent),
            ..query::ListFilter::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        children.iter().map(|s| s.id).collect::<Vec<_>>(),
        vec![child]
    );
    assert!(w.ledger.undone.is_empty());
}
both_backends!(completes_tests, a_child_completes);

// The child fails: it compensates itself, the parent's step fails, and the parent
// compensates the steps before it (the child's undo first, then the visa).
async fn a_failed_child_fails_its_step(backend: Backend) {
    let mut w = world(backend, 2).await;
    let parent = w.start("travel", json!({"trip": 8})).await;
    let child = child_id(parent, 1);
    w.pump(
        &[parent],
        |_, env, _| {
            Some(if env.destination == "hotel-agent" {
                StepOutcome::Fatal("no room".into())
            } else {
                ok()
            })
        },
        |_, _| ok(),
    )
    .await;
    let p = query::get(&w.store, parent).await.unwrap().unwrap();
    assert_eq!(p.state, SagaState::Compensated);
    let why = p.error.unwrap();
    assert!(why.contains("booking") && why.contains("no room"), "{why}");
    assert_eq!(
        state(&query::get(&w.store, child).await.unwrap()),
        SagaState::Compensated
    );
    // The failed hotel's compensation too: its outcome is unknown to the engine.
    assert_eq!(
        of(&w.ledger.undone, child),
        vec![1, 0],
        "the hotel, the flight"
    );
    assert_eq!(of(&w.ledger.undone, parent), vec![0], "the visa");
    let undone: Vec<SagaId> = w.ledger.undone.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        undone,
        vec![child, child, parent],
        "the child undoes itself first"
    );
    assert!(
        of(&w.ledger.done, parent).iter().all(|&i| i != 2),
        "no expense"
    );
}
both_backends!(fails_tests, a_failed_child_fails_its_step);

// The parent turns back after its child completed: the child is compensated as a
// whole (its steps undone in reverse, recorded in its own ledger), then the visa.
async fn a_completed_child_is_undone_when_its_parent_turns_back(backend: Backend) {
    let mut w = world(backend, 3).await;
    let parent = w.start("travel", json!({"trip": 9})).await;
    let child = child_id(parent, 1);
    w.pump(
        &[parent],
        |_, env, _| {
            Some(if env.destination == "expense-agent" {
                StepOutcome::Fatal("over budget".into())
            } else {
                ok()
            })
        },
        |_, _| ok(),
    )
    .await;
    let p = query::get(&w.store, parent).await.unwrap().unwrap();
    assert_eq!(p.state, SagaState::Compensated, "{:?}", p.error);
    let c = query::get(&w.store, child).await.unwrap().unwrap();
    assert_eq!(c.state, SagaState::Compensated);
    assert!(c.error.unwrap().contains("parent turned back"));
    assert_eq!(of(&w.ledger.done, child), vec![0, 1]);
    assert_eq!(
        of(&w.ledger.undone, child),
        vec![1, 0],
        "hotel, then flight"
    );
    assert_eq!(
        of(&w.ledger.undone, parent),
        vec![2, 0],
        "the expense, the visa"
    );
    let undone: Vec<SagaId> = w.ledger.undone.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        undone,
        vec![parent, child, child, parent],
        "the expense, the child (latest stage first), then the visa"
    );
    let steps = query::steps(&w.store, child).await.unwrap();
    assert!(
        steps
            .iter()
            .all(|s| s.compensation_state == Some(CompensationState::Done)),
        "the child's own ledger records its undo: {steps:?}"
    );
}
both_backends!(
    undone_tests,
    a_completed_child_is_undone_when_its_parent_turns_back
);

// An operator aborts the parent while its child runs: the child is aborted too (its
// steps undone, the one in flight included), then the parent's.
async fn aborting_a_parent_aborts_its_running_child(backend: Backend) {
    let mut w = world(backend, 4).await;
    let parent = w.start("travel", json!({"trip": 10})).await;
    let child = child_id(parent, 1);
    // Until the child waits on its hotel, whose agent never answers.
    let mut agent = silent_hotel;
    let mut comp = |_: &mut fastrand::Rng, _: &Envelope| ok();
    let (store, destinations) = (w.store.clone(), w.destinations.clone());
    testing::pump(
        &store,
        &destinations,
        "the child waits on its hotel",
        Duration::from_secs(30),
        async || {
            let steps = query::steps(&store, child).await.unwrap();
            steps.len() == 2 && steps[1].state == StepState::Dispatched
        },
        async |batch| {
            for env in batch.iter() {
                w.deliver(env, &mut agent, &mut comp).await;
            }
        },
    )
    .await;
    let mut tx = w.store.begin().await.unwrap();
    assert_eq!(
        w.engine.abort(&mut tx, parent).await.unwrap(),
        SagaState::Compensating
    );
    tx.commit().await.unwrap();
    w.pump(&[parent], silent_hotel, |_, _| ok()).await;
    both_compensated(&w, parent, child, "parent turned back").await;
    assert_eq!(of(&w.ledger.undone, parent), vec![0], "the visa");
}
both_backends!(abort_tests, aborting_a_parent_aborts_its_running_child);

// The child's start delivered again as a new message (a re-send, after the parent
// completed): it finds the first child, and no second one is written.
// Past the depth bound, a child is refused: nothing of it written, the parent's step
// fails with the reason.
async fn one_child_per_step_and_the_depth_bound(backend: Backend) {
    let mut w = world(backend, 5).await;
    let parent = w.start("travel", json!({"trip": 11})).await;
    let child = child_id(parent, 1);
    let (store, destinations) = (w.store.clone(), w.destinations.clone());
    let mut agent = |_: &mut fastrand::Rng, _: &Envelope, _: usize| Some(ok());
    let mut comp = |_: &mut fastrand::Rng, _: &Envelope| ok();
    let starts = std::cell::RefCell::new(Vec::new());
    testing::pump(
        &store,
        &destinations,
        "the child's start is delivered",
        Duration::from_secs(30),
        async || !starts.borrow().is_empty(),
        async |batch| {
            for env in batch.iter() {
                if env.destination == "saga.booking.child" {
                    starts.borrow_mut().push(env.clone());
                }
                w.deliver(env, &mut agent, &mut comp).await;
            }
        },
    )
    .await;
    w.pump(&[parent], |_, _, _| Some(ok()), |_, _| ok()).await;
    assert_eq!(
        state(&query::get(&w.store, parent).await.unwrap()),
        SagaState::Completed
    );
    let mut again = starts.borrow()[0].clone();
    again.id = agentsaga_core::MessageId::new();
    let mut tx = w.store.begin().await.unwrap();
    let handled = w.engine.handle(&mut tx, &again).await.unwrap();
    tx.commit().await.unwrap();
    assert!(
        matches!(handled, Handled::Advanced { saga, state: SagaState::Completed } if saga == child),
        "{handled:?}"
    );
    // Its answer (the child's outcome again) is late for the parent: ignored.
    let answers = claim_of(&w.store, "saga.travel.v1").await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    let mut tx = w.store.begin().await.unwrap();
    let handled = w.engine.handle(&mut tx, &answers[0]).await.unwrap();
    tx.commit().await.unwrap();
    assert!(matches!(handled, Handled::Ignored(_)), "{handled:?}");
    assert_eq!(
        state(&query::get(&w.store, parent).await.unwrap()),
        SagaState::Completed
    );
    let all = query::list(&w.store, &query::ListFilter::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 2, "the parent and one child: {all:?}");
    assert_eq!(all.iter().filter(|s| s.id == child).count(), 1);

    // A start sent by an engine that wrote no limits' headers (an older one): the
    // child's depth and its parent's children are read from the database instead, and
    // the bounds hold. Here its parent is a saga started on its own with one child.
    let mut bare = starts.borrow()[0].clone();
    bare.id = agentsaga_core::MessageId::new();
    bare.headers.remove(protocol::CHILD_DEPTH);
    bare.headers.remove(protocol::CHILDREN_BEFORE);
    bare.headers.insert(protocol::STEP.into(), "2".into());
    for (limits, refused) in [
        ((1, 2), None),
        ((0, 2), Some("levels deep")),
        ((1, 1), Some("the bound is 1")),
    ] {
        let engine = w.engine.clone().with_child_limits(limits.0, limits.1);
        let mut tx = w.store.begin().await.unwrap();
        let handled = engine.handle(&mut tx, &bare).await.unwrap();
        tx.rollback().await.unwrap();
        match refused {
            None => assert!(
                matches!(handled, Handled::Advanced { .. }),
                "{limits:?}: {handled:?}"
            ),
            Some(why) => assert!(
                matches!(&handled, Handled::Ignored(w) if w.contains(why)),
                "{limits:?}: {handled:?} does not say `{why}`"
            ),
        }
        bare.id = agentsaga_core::MessageId::new();
    }

    // Depth bound 0: no child may start.
    refused_by_the_limits(backend, (0, 64), "levels deep").await;
}

/// Answers every command but the hotel's (whose agent never answers).
fn silent_hotel(_: &mut fastrand::Rng, env: &Envelope, _: usize) -> Option<StepOutcome> {
    (env.destination != "hotel-agent").then(ok)
}

/// `parent` and its `child` compensated, the child's error saying `why`, its steps
/// undone in reverse (the hotel, whose outcome is unknown, then the flight).
async fn both_compensated(w: &World, parent: SagaId, child: SagaId, why: &str) {
    let p = query::get(&w.store, parent).await.unwrap();
    assert_eq!(state(&p), SagaState::Compensated);
    let c = query::get(&w.store, child).await.unwrap().unwrap();
    assert_eq!(c.state, SagaState::Compensated);
    let error = c.error.unwrap();
    assert!(error.contains(why), "`{error}` does not say `{why}`");
    assert_eq!(
        of(&w.ledger.undone, child),
        vec![1, 0],
        "the hotel, then the flight"
    );
}

/// A `travel` whose child the limits `(depth, children)` refuse: nothing of the child
/// is written, and the parent compensates (its visa) with the reason, `why`.
async fn refused_by_the_limits(backend: Backend, (depth, children): (u32, u32), why: &str) {
    let mut w = World::new(backend, vec![booking(), travel()], 6).await;
    w.engine = w.engine.clone().with_child_limits(depth, children);
    let parent = w.start("travel", json!({"trip": 12})).await;
    w.pump(&[parent], |_, _, _| Some(ok()), |_, _| ok()).await;
    let p = query::get(&w.store, parent).await.unwrap().unwrap();
    assert_eq!(p.state, SagaState::Compensated);
    let error = p.error.unwrap();
    assert!(error.contains(why), "`{error}` does not say `{why}`");
    let child = query::get(&w.store, child_id(parent, 1)).await.unwrap();
    assert!(child.is_none(), "a refused child was written: {child:?}");
    assert_eq!(of(&w.ledger.undone, parent), vec![0], "the visa");
}
both_backends!(once_and_depth_tests, one_child_per_step_and_the_depth_bound);

#[test]
fn the_engine_refuses_children_it_cannot_run_or_undo() {
    let err = Engine::new([travel()]).unwrap_err();
    assert!(err.to_string().contains("not registered"), "{err}");
    let pivoted = Saga::<D>::builder("booking", 1)
        .pivot(Step::new("pay", "pay-agent"))
        .build()
        .unwrap();
    let err = Engine::new([pivoted.clone(), travel()]).unwrap_err();
    assert!(err.to_string().contains("has a pivot"), "{err}");
    // As the parent's pivot, it may.
    let forward = Saga::<D>::builder("travel", 1)
        .pivot(Step::saga("book", "booking").forward_only())
        .build()
        .unwrap();
    Engine::new([pivoted, forward]).unwrap();
    // Child ids: one per parent step, never a saga's own (v7) id.
    let p = SagaId::new();
    assert_eq!(child_id(p, 1), child_id(p, 1));
    assert_ne!(child_id(p, 1), child_id(p, 2));
    assert_eq!(child_id(p, 1).as_uuid().get_version_num(), 8);
}
