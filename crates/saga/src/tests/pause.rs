//! An operator's pause (`Engine::pause`, `Engine::resume`): a paused saga sends
//! nothing new, records the answers of what it sent before, and sends what it held
//! back once resumed, from an engine with its definition or (as the CLI) without.

use super::*;
use crate::Paused;

/// Three undoable steps one after the other (`a`, `b`, `c`).
fn steady() -> SagaDefinition {
    let undoable = |n: &str| {
        Step::<D>::new(n, format!("{n}-agent"))
            .command(|d: &D| d.clone())
            .compensate(format!("{n}-agent"), |_: &D| json!("undo"))
            .retry(fast())
    };
    Saga::<D>::builder("steady", 1)
        .step(undoable("a"))
        .step(undoable("b"))
        .step(undoable("c"))
        .build()
        .unwrap()
}

async fn pause(w: &World, id: SagaId) -> crate::Result<SagaState> {
    let mut tx = w.store.begin().await.unwrap();
    let out = w
        .engine
        .pause(&mut tx, id, "ops-anna", "the LLM drafts nonsense")
        .await;
    tx.commit().await.unwrap();
    out
}

async fn resume(w: &World, engine: &Engine, id: SagaId) -> crate::Result<SagaState> {
    let mut tx = w.store.begin().await.unwrap();
    let out = engine.resume(&mut tx, id).await;
    tx.commit().await.unwrap();
    out
}

/// Delivers until `a` is done and `b` sent.
async fn b_is_sent(w: &mut World, id: SagaId) {
    let store = w.store.clone();
    w.pump_until(
        "`a` done, `b` sent",
        async || query::steps(&store, id).await.unwrap().len() == 2,
        |_, _, _| Some(ok()),
        |_, _| ok(),
    )
    .await;
}

fn resumer(with_definition: bool) -> Engine {
    if with_definition {
        Engine::new([steady()]).unwrap()
    } else {
        Engine::new(Vec::<SagaDefinition>::new()).unwrap()
    }
}

// Paused right after its start: `a`, sent already, is delivered and its answer
// recorded; `b` is not sent, however long the saga waits. Resumed, it goes on to the
// end, each step once. The pause shows who, why and when.
async fn a_paused_saga_sends_nothing_new(backend: Backend) {
    for with_definition in [true, false] {
        let mut w = World::new(backend, vec![steady()], 7).await;
        let id = w.start("steady", json!({ "n": 1 })).await;
        assert_eq!(pause(&w, id).await.unwrap(), SagaState::Running);
        let s = query::get(&w.store, id).await.unwrap().unwrap();
        let paused = s.paused.expect("shown paused");
        assert_eq!(
            (paused.by.as_str(), paused.reason.as_str()),
            ("ops-anna", "the LLM drafts nonsense")
        );
        let store = w.store.clone();
        w.pump_until(
            "`a` answered, nothing on its way",
            async || quiet(&store).await,
            |_, _, _| Some(ok()),
            |_, _| ok(),
        )
        .await;
        let steps = query::steps(&w.store, id).await.unwrap();
        assert_eq!(steps.len(), 1, "`b` is not sent while paused");
        assert_eq!(
            steps[0].state,
            StepState::Succeeded,
            "`a`'s answer recorded"
        );
        assert_eq!(of(&w.ledger.done, id), [0]);
        let s = query::get(&w.store, id).await.unwrap().unwrap();
        assert_eq!(s.state, SagaState::Running);

        resume(&w, &resumer(with_definition), id).await.unwrap();
        w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
        let s = query::get(&w.store, id).await.unwrap().unwrap();
        assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
        assert_eq!(s.paused, None);
        assert_eq!(of(&w.ledger.done, id), [0, 1, 2], "each step once");
    }
}
both_backends!(sends_nothing_new_tests, a_paused_saga_sends_nothing_new);

// Paused while `b` is on its way, and `b` fails for good: the saga turns back, but
// `a`'s compensation waits for the resume; a retryable failure's retry waits too.
async fn a_paused_saga_holds_its_retries_and_compensations(backend: Backend) {
    for with_definition in [true, false] {
        let mut w = World::new(backend, vec![steady()], 7).await;
        let id = w.start("steady", json!({ "n": 2 })).await;
        let store = w.store.clone();
        b_is_sent(&mut w, id).await;
        pause(&w, id).await.unwrap();
        let mut tries = 0;
        w.pump_until(
            "`b` failed, nothing on its way",
            async || quiet(&store).await,
            |_, _, step| {
                (step == 1).then(|| {
                    tries += 1;
                    if tries == 1 {
                        StepOutcome::Retryable("busy".into())
                    } else {
                        StepOutcome::Fatal("declined".into())
                    }
                })
            },
            |_, _| ok(),
        )
        .await;
        assert_eq!(tries, 1, "the retry waits for the resume");
        let steps = query::steps(&w.store, id).await.unwrap();
        assert_eq!(steps[1].attempts, 1);

        resume(&w, &resumer(with_definition), id).await.unwrap();
        // Resumed: the retry goes, is declined, and the saga turns back: `a` undone.
        w.pump(
            &[id],
            |_, _, step| {
                (step == 1).then(|| {
                    tries += 1;
                    StepOutcome::Fatal("declined".into())
                })
            },
            |_, _| ok(),
        )
        .await;
        assert_eq!(tries, 2, "retried once, after the resume");
        let s = query::get(&w.store, id).await.unwrap().unwrap();
        assert_eq!(s.state, SagaState::Compensated, "{:?}", s.error);
        // `b` too: the engine undoes every step sent before the pivot, latest first.
        assert_eq!(of(&w.ledger.undone, id), [1, 0]);

        // Paused while compensating: the compensation waits.
        let id = w.start("steady", json!({ "n": 3 })).await;
        b_is_sent(&mut w, id).await;
        pause(&w, id).await.unwrap();
        w.pump_until(
            "turned back, nothing on its way",
            async || quiet(&store).await,
            |_, _, _| Some(StepOutcome::Fatal("declined".into())),
            |_, _| ok(),
        )
        .await;
        let s = query::get(&w.store, id).await.unwrap().unwrap();
        assert_eq!(s.state, SagaState::Compensating);
        assert_eq!(of(&w.ledger.undone, id), Vec::<usize>::new(), "held");
        resume(&w, &resumer(with_definition), id).await.unwrap();
        w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
        let s = query::get(&w.store, id).await.unwrap().unwrap();
        assert_eq!(s.state, SagaState::Compensated, "{:?}", s.error);
        assert_eq!(of(&w.ledger.undone, id), [1, 0]);
    }
}
both_backends!(
    holds_tests,
    a_paused_saga_holds_its_retries_and_compensations
);

// What cannot be paused or resumed is refused, saying why, with nothing changed: a
// finished saga, a paused one paused again, a running one resumed. An abort ends a
// pause (the saga turns back now).
async fn pauses_that_make_no_sense_are_refused(backend: Backend) {
    let mut w = World::new(backend, vec![steady()], 7).await;
    let id = w.start("steady", json!({ "n": 4 })).await;
    let err = resume(&w, &w.engine, id).await.unwrap_err();
    assert!(
        matches!(&err, Error::WrongState { why, .. } if why.contains("not paused")),
        "{err}"
    );
    pause(&w, id).await.unwrap();
    let err = pause(&w, id).await.unwrap_err();
    assert!(
        matches!(&err, Error::WrongState { why, .. } if why.contains("paused already")),
        "{err}"
    );
    let mut tx = w.store.begin().await.unwrap();
    w.engine.abort(&mut tx, id).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        query::get(&w.store, id).await.unwrap().unwrap().paused,
        None
    );
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    let err = pause(&w, id).await.unwrap_err();
    assert!(
        matches!(&err, Error::WrongState { why, .. } if why.contains("finished")),
        "{err}"
    );
    let _: Option<Paused> = s.paused;
}
both_backends!(refused_tests, pauses_that_make_no_sense_are_refused);
