//! A saga's lifecycle, scripted: the happy path, parallel replies, failures and
//! retries, timeouts, a stuck compensation and the operator's actions, abort and versions.

use super::*;

async fn happy_path(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 1).await;
    let id = w.start("trip", json!({"trip": 1})).await;
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed);
    assert_eq!(w.ledger.done.len(), 5);
    assert!(w.ledger.undone.is_empty());
    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(steps.len(), 5);
    assert!(steps.iter().all(|s| s.state == StepState::Succeeded));
    // The ledger was written with each dispatch, and never used.
    assert_eq!(
        steps[0].compensation_state,
        Some(CompensationState::Recorded)
    );
    assert_eq!(
        steps[0]
            .compensation_payload
            .as_deref()
            .map(|p| p.contains("cancel")),
        Some(true)
    );
    assert_eq!(
        steps[3].compensation_state, None,
        "the pivot has no compensation"
    );
    // Every timer was cancelled when its step replied: nothing left pending.
    assert_eq!(w.store.admin().stats().await.unwrap().pending, 0);
}
both_backends!(happy_path_tests, happy_path);

// The two replies of a parallel stage handled at the same time, in two transactions:
// the second waits for the first (the instance lock on PostgreSQL, the single writer on
// SQLite) and must then read the first's step update, or neither would see the stage
// complete and the saga would never move on.
async fn concurrent_replies_of_a_parallel_stage(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 1).await;
    let id = w.start("trip", json!({"trip": 1})).await;
    let claim_all = |store: Store, destinations: Vec<String>| async move {
        let batch = testing::claim(&store, &destinations, 64).await;
        let seqs: Vec<i64> = batch.iter().map(|e| e.seq).collect();
        store.queue().mark_delivered("t", &seqs).await.unwrap();
        batch
    };
    let mut agent = |_: &mut fastrand::Rng, _: &Envelope, _: usize| Some(ok());
    let mut comp = |_: &mut fastrand::Rng, _: &Envelope| ok();
    // The flight's command, its reply, then the hotel's and the car's commands.
    for expect in [1, 1, 2] {
        let batch = claim_all(w.store.clone(), w.destinations.clone()).await;
        assert_eq!(batch.len(), expect);
        for env in &batch {
            w.deliver(env, &mut agent, &mut comp).await;
        }
    }
    let replies = claim_all(w.store.clone(), w.destinations.clone()).await;
    assert_eq!(replies.len(), 2, "the hotel's and the car's replies");
    assert!(replies.iter().all(|e| e.destination.starts_with("saga.")));

    let mut first = w.store.begin().await.unwrap();
    w.engine.handle(&mut first, &replies[0]).await.unwrap();
    let (store, engine, second_reply) = (w.store.clone(), w.engine.clone(), replies[1].clone());
    let second = tokio::spawn(async move {
        let mut tx = store.begin().await.unwrap();
        let handled = engine.handle(&mut tx, &second_reply).await.unwrap();
        tx.commit().await.unwrap();
        handled
    });
    // Time for the second reply to reach the saga's lock (and, wrongly, to finish): that
    // it waits has no condition to poll for.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!second.is_finished(), "the second reply did not wait");
    first.commit().await.unwrap();
    second.await.unwrap();

    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(steps.len(), 4, "the pivot was dispatched: {steps:?}");
    assert!(steps[..3].iter().all(|s| s.state == StepState::Succeeded));
    let next = claim_all(w.store.clone(), w.destinations.clone()).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].destination, "charge-agent");
}
both_backends!(
    concurrent_replies_tests,
    concurrent_replies_of_a_parallel_stage
);

async fn fatal_failure_compensates_in_reverse(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 2).await;
    let id = w.start("trip", json!({"trip": 2})).await;
    // The pivot (step 3) declines: flight, then the hotel+car group, are undone.
    w.pump(&[id], fatal_at(3, "card declined"), |_, _| ok())
        .await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    assert!(s.error.unwrap().contains("card declined"));
    let undone: Vec<usize> = w.ledger.undone.iter().map(|(_, i)| *i).collect();
    assert_eq!(undone.len(), 3);
    assert_eq!(undone[2], 0, "the flight is undone last: {undone:?}");
    assert_eq!(
        undone[..2].iter().collect::<HashSet<_>>(),
        [1, 2].iter().collect()
    );
}
both_backends!(fatal_tests, fatal_failure_compensates_in_reverse);

async fn retryable_then_success_and_timeouts(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 3).await;
    let id = w.start("trip", json!({"trip": 3})).await;
    let mut calls: HashMap<usize, u32> = HashMap::new();
    // Flight: retryable twice then ok. Confirm (after the pivot): the agent "crashes"
    // (no reply) twice, then answers; no timeout is set on it, so retryable answers
    // drive it: retryable 5 times (beyond the 3-attempt budget: after the pivot there is
    // no budget), then ok.
    w.pump(
        &[id],
        |_, _, step| {
            let n = calls.entry(step).or_default();
            *n += 1;
            Some(match (step, *n) {
                (0, 1..=2) => StepOutcome::Retryable("flaky".into()),
                (4, 1..=5) => StepOutcome::Retryable("smtp down".into()),
                _ => ok(),
            })
        },
        |_, _| ok(),
    )
    .await;
    assert_eq!(
        query::get(&w.store, id).await.unwrap().unwrap().state,
        SagaState::Completed
    );
    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(steps[0].attempts, 3);
    assert_eq!(steps[4].attempts, 6);
}
both_backends!(retry_tests, retryable_then_success_and_timeouts);

async fn timeout_compensates_the_unknown_step_too(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 4).await;
    let id = w.start("trip", json!({"trip": 4})).await;
    // The car agent never answers: after its timeout the saga compensates the car
    // (outcome unknown), the hotel and the flight.
    w.pump(
        &[id],
        |_, _, step| if step == 2 { None } else { Some(ok()) },
        |_, _| ok(),
    )
    .await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    assert!(s.error.unwrap().contains("timed out"));
    let mut undone: Vec<usize> = w.ledger.undone.iter().map(|(_, i)| *i).collect();
    assert_eq!(undone.pop(), Some(0));
    undone.sort();
    assert_eq!(undone, vec![1, 2]);
}
both_backends!(timeout_tests, timeout_compensates_the_unknown_step_too);

async fn stuck_compensation_and_operator_actions(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 5).await;
    let id = w.start("trip", json!({"trip": 5})).await;
    // The flight's cancellation always fails: stuck after 10 attempts.
    let fail_flight = |_: &mut fastrand::Rng, e: &Envelope| {
        if e.destination == "flight-agent" {
            StepOutcome::Fatal("cancel API down".into())
        } else {
            ok()
        }
    };
    w.pump(&[id], fatal_at(1, "no rooms"), fail_flight).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Stuck);
    assert!(
        s.error.as_deref().unwrap().contains("cancel API down"),
        "{s:?}"
    );
    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(steps[0].compensation_state, Some(CompensationState::Failed));
    assert_eq!(steps[0].compensation_attempts, 10);

    // Abort refuses (a compensation failed) and changes nothing.
    let mut tx = w.store.begin().await.unwrap();
    assert!(matches!(
        w.engine.abort(&mut tx, id).await,
        Err(Error::WrongState { .. })
    ));
    tx.rollback().await.unwrap();
    // Retry: it fails again 10 times, still stuck.
    let mut tx = w.store.begin().await.unwrap();
    assert_eq!(
        w.engine.retry(&mut tx, id).await.unwrap(),
        SagaState::Compensating
    );
    tx.commit().await.unwrap();
    w.pump(&[id], |_, _, _| Some(ok()), fail_flight).await;
    assert_eq!(
        query::get(&w.store, id).await.unwrap().unwrap().state,
        SagaState::Stuck
    );
    // Skip: recorded as skipped by hand, and the saga ends compensated.
    let mut tx = w.store.begin().await.unwrap();
    assert_eq!(
        w.engine.skip(&mut tx, id).await.unwrap(),
        SagaState::Compensated
    );
    tx.commit().await.unwrap();
    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(
        steps[0].compensation_state,
        Some(CompensationState::Skipped)
    );
    assert!(
        steps[0]
            .compensation_error
            .as_deref()
            .unwrap()
            .contains("skipped by an operator")
    );
    // A terminal saga refuses every action.
    let mut tx = w.store.begin().await.unwrap();
    for r in [
        w.engine.abort(&mut tx, id).await,
        w.engine.retry(&mut tx, id).await,
        w.engine.skip(&mut tx, id).await,
    ] {
        assert!(
            matches!(
                r,
                Err(Error::WrongState {
                    state: SagaState::Compensated,
                    ..
                })
            ),
            "{r:?}"
        );
    }
    assert!(matches!(
        w.engine.abort(&mut tx, SagaId::new()).await,
        Err(Error::NotFound(_))
    ));
}
both_backends!(stuck_tests, stuck_compensation_and_operator_actions);

async fn abort_running_and_versions(backend: Backend) {
    let mut w = World::new(backend, vec![trip()], 6).await;
    let id = w.start("trip", json!({"trip": 6})).await;
    let mut tx = w.store.begin().await.unwrap();
    assert_eq!(
        w.engine.abort(&mut tx, id).await.unwrap(),
        SagaState::Compensating
    );
    tx.commit().await.unwrap();
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    assert!(s.error.unwrap().contains("aborted by an operator"));

    // Unknown saga name: a typed error, nothing written.
    let mut tx = w.store.begin().await.unwrap();
    assert!(matches!(
        w.engine.start(&mut tx, "nope", &json!({})).await,
        Err(Error::UnknownSaga(_))
    ));
    tx.rollback().await.unwrap();

    // An instance of a version this engine lacks is not advanced.
    let v2 = Saga::<D>::builder("trip", 2)
        .step(Step::new("only", "only-agent").nothing_to_undo())
        .build()
        .unwrap();
    let engine_v2 = Engine::new([v2]).unwrap();
    let mut tx = w.store.begin().await.unwrap();
    let old = w
        .engine
        .start(&mut tx, "trip", &json!({"trip": 7}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let cmd = testing::claim(&w.store, &["flight-agent".to_owned()], 1)
        .await
        .remove(0);
    let mut tx = w.store.begin().await.unwrap();
    let reply = protocol::reply(&cmd, &ok()).unwrap().unwrap();
    assert_eq!(reply.destination, "saga.trip.v1");
    tx.enqueue(&reply).await.unwrap();
    tx.commit().await.unwrap();
    let env = testing::claim(&w.store, &["saga.trip.v1".to_owned()], 1)
        .await
        .remove(0);
    let mut tx = w.store.begin().await.unwrap();
    assert!(matches!(
        engine_v2.handle(&mut tx, &env).await,
        Err(Error::VersionNotRegistered { version: 1, .. })
    ));
    tx.rollback().await.unwrap();
    // The version-1 engine takes it.
    let mut tx = w.store.begin().await.unwrap();
    assert!(matches!(
        w.engine.handle(&mut tx, &env).await.unwrap(),
        Handled::Advanced { .. }
    ));
    // A duplicate of it is recognised in the same transaction.
    assert_eq!(
        w.engine.handle(&mut tx, &env).await.unwrap(),
        Handled::Duplicate
    );
    tx.commit().await.unwrap();
    assert_eq!(
        query::steps(&w.store, old).await.unwrap()[0].state,
        StepState::Succeeded
    );
}
both_backends!(abort_version_tests, abort_running_and_versions);
