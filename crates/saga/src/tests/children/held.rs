//! A child that holds its parent: stuck (the parent waits, visibly, for an operator),
//! timed out (aborted by the parent step's timeout); the fan-out bound.

use super::*;

/// A child with a pivot, as its parent's pivot; the step after the child's pivot
/// fails fatally when `stuck`.
pub(super) fn pivoted_booking() -> SagaDefinition {
    Saga::<D>::builder("booking", 1)
        .step(
            Step::<D>::new("flight", "flight-agent")
                .compensate("flight-agent", |_: &D| json!("undo"))
                .retry(fast()),
        )
        .pivot(Step::new("pay", "pay-agent").retry(fast()))
        .step(Step::new("ticket", "ticket-agent").retry(fast()))
        .build()
        .unwrap()
}

fn pivoted_travel() -> SagaDefinition {
    Saga::<D>::builder("travel", 1)
        .step(
            Step::<D>::new("visa", "visa-agent")
                .compensate("visa-agent", |_: &D| json!("undo"))
                .retry(fast()),
        )
        .pivot(Step::saga("book", "booking").forward_only())
        .build()
        .unwrap()
}

// A stuck child keeps its parent's step waiting, visibly (the parent is stalled),
// until an operator acts on the child: aborted, it fails the parent's step.
async fn a_stuck_child_holds_its_parent_until_an_operator_acts(backend: Backend) {
    let mut w = World::new(backend, vec![pivoted_booking(), pivoted_travel()], 7).await;
    let parent = w.start("travel", json!({"trip": 13})).await;
    let child = child_id(parent, 1);
    let ticket_fails = |_: &mut fastrand::Rng, env: &Envelope, _: usize| {
        Some(if env.destination == "ticket-agent" {
            StepOutcome::Fatal("no tickets left".into())
        } else {
            ok()
        })
    };
    let (store, destinations) = (w.store.clone(), w.destinations.clone());
    let (mut agent, mut comp) = (ticket_fails, |_: &mut fastrand::Rng, _: &Envelope| ok());
    testing::pump(
        &store,
        &destinations,
        "the child is stuck",
        Duration::from_secs(30),
        async || {
            let c = query::get(&store, child).await.unwrap();
            c.is_some_and(|c| c.state == SagaState::Stuck)
        },
        async |batch| {
            for env in batch.iter() {
                w.deliver(env, &mut agent, &mut comp).await;
            }
        },
    )
    .await;
    assert_eq!(
        state(&query::get(&w.store, parent).await.unwrap()),
        SagaState::Running
    );
    let stalled = query::list(
        &w.store,
        &query::ListFilter {
            stalled: Some(Duration::from_secs(3600)),
            ..query::ListFilter::default()
        },
    )
    .await
    .unwrap();
    assert!(
        stalled.iter().any(|s| s.id == parent),
        "the waiting parent shows as stalled: {stalled:?}"
    );
    let mut tx = w.store.begin().await.unwrap();
    assert_eq!(
        w.engine.abort(&mut tx, child).await.unwrap(),
        SagaState::Aborted
    );
    tx.commit().await.unwrap();
    w.pump(&[parent], ticket_fails, |_, _| ok()).await;
    let p = query::get(&w.store, parent).await.unwrap().unwrap();
    // The child was the parent's pivot: its failure compensates what came before.
    assert_eq!(p.state, SagaState::Compensated);
    assert!(p.error.unwrap().contains("aborted"));
    assert_eq!(of(&w.ledger.undone, parent), vec![0], "the visa");
    assert!(
        of(&w.ledger.undone, child).is_empty(),
        "past its pivot: nothing undone"
    );
}
both_backends!(
    stuck_tests,
    a_stuck_child_holds_its_parent_until_an_operator_acts
);

// The parent's step timeout bounds its child: past it the child is aborted (its steps
// undone), and the parent's step fails. A fan-out bound of 0 refuses every child.
async fn a_timed_out_child_and_the_fan_out_bound(backend: Backend) {
    let timed = Saga::<D>::builder("travel", 1)
        .step(
            Step::<D>::new("visa", "visa-agent")
                .compensate("visa-agent", |_: &D| json!("undo"))
                .retry(fast()),
        )
        .step(Step::saga("book", "booking").timeout(Duration::from_millis(200)))
        .build()
        .unwrap();
    let mut w = World::new(backend, vec![booking(), timed], 8).await;
    let parent = w.start("travel", json!({"trip": 14})).await;
    let child = child_id(parent, 1);
    w.pump(&[parent], super::silent_hotel, |_, _| ok()).await;
    super::both_compensated(&w, parent, child, "deadline").await;
    assert_eq!(of(&w.ledger.undone, parent), vec![0]);

    super::refused_by_the_limits(backend, (4, 0), "the bound is 0").await;
}
both_backends!(
    timeout_and_fan_out_tests,
    a_timed_out_child_and_the_fan_out_bound
);
