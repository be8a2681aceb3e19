//! An operator's rewind (`Engine::rewind`): the step and those after it are undone,
//! latest first, by their compensations; then the saga runs forward again from the
//! step with its data as the step's stage began, from an engine with its definition or
//! (as the CLI) without; what cannot be rewound is refused with nothing changed.

use super::*;
use crate::Signal;

mod kinds;

/// `research`, `draft` (its answer folded into the data), each undoable; `approve`, a
/// wait for a person's signal; `send`, the pivot; then `notify`.
fn drafting() -> SagaDefinition {
    let undoable = |n: &str| {
        Step::<D>::new(n, format!("{n}-agent"))
            .command(|d: &D| d.clone())
            .compensate(format!("{n}-agent"), |_: &D| json!("undo"))
            .retry(fast())
    };
    Saga::<D>::builder("drafting", 1)
        .step(undoable("research"))
        .step(undoable("draft").on_reply(|d: &mut D, draft: String| d["draft"] = json!(draft)))
        .step(Step::wait_for("approve"))
        .pivot(
            Step::new("send", "send-agent")
                .command(|d: &D| d.clone())
                .retry(fast()),
        )
        .step(Step::new("notify", "notify-agent").retry(fast()))
        .build()
        .unwrap()
}

async fn rewind(w: &World, engine: &Engine, id: SagaId, to: &str) -> crate::Result<SagaState> {
    let mut tx = w.store.begin().await.unwrap();
    let out = engine
        .rewind(&mut tx, id, to, "ops-anna", "the draft is off topic")
        .await;
    tx.commit().await.unwrap();
    out
}

async fn pause(w: &World, id: SagaId) {
    let mut tx = w.store.begin().await.unwrap();
    w.engine
        .pause(&mut tx, id, "ops-anna", "look")
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

async fn approve(w: &World, id: SagaId) {
    let mut tx = w.store.begin().await.unwrap();
    Engine::signal(&mut tx, id, "approve", Signal::Approve(json!("yes")))
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

fn engine(with_definition: bool) -> Engine {
    if with_definition {
        Engine::new([drafting()]).unwrap()
    } else {
        Engine::new(Vec::<SagaDefinition>::new()).unwrap()
    }
}

/// Drafts `draft 1`, `draft 2`, … and records the data each `draft` command carried.
struct Drafter {
    drafts: usize,
    seen: Vec<Value>,
}

impl Drafter {
    fn answer(&mut self, env: &Envelope, step: usize) -> Option<StepOutcome> {
        if step != 1 {
            return Some(ok());
        }
        self.drafts += 1;
        self.seen
            .push(serde_json::from_str(&env.payload).expect("a JSON command"));
        Some(StepOutcome::Ok(json!(format!("draft {}", self.drafts))))
    }
}

// Drafted, approved while paused (its pivot held), rewound to `draft`: the
// approval's wait needs nothing undone, `draft` is undone (after nothing later needed
// it), `research` is kept; `draft` runs again with the data as its stage began (no
// first draft in it), the wait asks for a new approval (the old one belonged to the
// run undone), and the saga completes with the second draft, each step's row afresh.
// The rewind is kept with who, why, and the steps it undid.
async fn a_rewind_undoes_and_runs_again_from_the_step(backend: Backend) {
    for with_definition in [true, false] {
        let mut w = World::new(backend, vec![drafting()], 11).await;
        let store = w.store.clone();
        let mut drafter = Drafter {
            drafts: 0,
            seen: Vec::new(),
        };
        let id = w.start("drafting", json!({ "topic": "rust" })).await;
        w.pump_until(
            "drafted, waiting for approval",
            async || {
                let s = query::get(&store, id).await.unwrap().unwrap();
                quiet(&store).await && s.waiting_for.is_some()
            },
            |_, env, step| drafter.answer(env, step),
            |_, _| ok(),
        )
        .await;
        // Approved while paused: `send` is held, nothing is in flight.
        pause(&w, id).await;
        approve(&w, id).await;
        w.pump_until(
            "approved, `send` held",
            async || quiet(&store).await,
            |_, env, step| drafter.answer(env, step),
            |_, _| ok(),
        )
        .await;
        let steps = query::steps(&store, id).await.unwrap();
        assert_eq!(steps.len(), 3, "`send` waits for the resume: {steps:?}");
        assert!(steps.iter().all(|s| s.state == StepState::Succeeded));
        assert_eq!(
            query::data(&store, id).await.unwrap().unwrap()["draft"],
            json!("draft 1")
        );

        let state = rewind(&w, &engine(with_definition), id, "draft")
            .await
            .unwrap();
        assert_eq!(state, SagaState::Compensating, "the undos under way");
        let s = query::get(&store, id).await.unwrap().unwrap();
        assert_eq!(s.paused, None, "a rewind ends the pause");
        let rewinds = query::rewinds(&store, id).await.unwrap();
        assert_eq!(rewinds.len(), 1);
        assert_eq!(rewinds[0].done_ms, None, "under way");

        // Runs again from `draft`: the wait waits for a new approval.
        w.pump_until(
            "drafted again, waiting for approval",
            async || {
                let s = query::get(&store, id).await.unwrap().unwrap();
                quiet(&store).await && s.waiting_for.as_deref() == Some("approve")
            },
            |_, env, step| drafter.answer(env, step),
            |_, _| ok(),
        )
        .await;
        let s = query::get(&store, id).await.unwrap().unwrap();
        assert_eq!(s.state, SagaState::Running, "{:?}", s.error);
        assert_eq!(
            of(&w.ledger.undone, id),
            [1],
            "`draft` undone, `research` kept"
        );
        assert_eq!(drafter.drafts, 2);
        assert_eq!(drafter.seen[0], json!({ "topic": "rust" }));
        assert_eq!(
            drafter.seen[1],
            json!({ "topic": "rust" }),
            "`draft` runs again with the data as its stage began"
        );
        approve(&w, id).await;
        w.pump(&[id], |_, env, step| drafter.answer(env, step), |_, _| ok())
            .await;
        let s = query::get(&store, id).await.unwrap().unwrap();
        assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
        assert_eq!(of(&w.ledger.done, id), [0, 1, 1, 3, 4]);
        assert_eq!(
            query::data(&store, id).await.unwrap().unwrap()["draft"],
            json!("draft 2")
        );
        let steps = query::steps(&store, id).await.unwrap();
        assert_eq!(steps.len(), 5);
        assert!(
            steps.iter().all(|s| s.attempts == 1),
            "each row afresh: {steps:?}"
        );

        let rewinds = query::rewinds(&store, id).await.unwrap();
        assert_eq!(rewinds.len(), 1);
        let r = &rewinds[0];
        assert_eq!(
            (r.to.as_str(), r.by.as_str(), r.reason.as_str()),
            ("draft", "ops-anna", "the draft is off topic")
        );
        assert!(r.done_ms.is_some());
        let undone: Vec<_> = r.undone.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(undone, ["approve", "draft"], "latest first");
        assert_eq!(r.undone[1].output, Some(json!("draft 1")));
        assert_eq!(r.undone[1].compensation, Some(CompensationState::Done));
    }
}
both_backends!(
    runs_again_tests,
    a_rewind_undoes_and_runs_again_from_the_step
);

// A rewind with nothing to undo but a wait (to `approve`): from an engine without the
// definition, the saga asks its orchestrator to send the stage afresh, which it does.
async fn a_rewind_with_nothing_to_undo_asks_the_orchestrator(backend: Backend) {
    let mut w = World::new(backend, vec![drafting()], 12).await;
    let store = w.store.clone();
    let id = w.start("drafting", json!({ "topic": "go" })).await;
    w.pump_until(
        "waiting for approval",
        async || {
            let s = query::get(&store, id).await.unwrap().unwrap();
            quiet(&store).await && s.waiting_for.is_some()
        },
        |_, _, _| Some(ok()),
        |_, _| ok(),
    )
    .await;
    // Approved while paused: `send` is held, nothing is in flight.
    pause(&w, id).await;
    approve(&w, id).await;
    w.pump_until(
        "approved",
        async || quiet(&store).await,
        |_, _, _| Some(ok()),
        |_, _| ok(),
    )
    .await;
    assert_eq!(query::steps(&store, id).await.unwrap().len(), 3);
    let state = rewind(&w, &engine(false), id, "approve").await.unwrap();
    assert_eq!(
        state,
        SagaState::Running,
        "nothing to undo: rewound at once"
    );
    w.pump_until(
        "waiting for approval again",
        async || {
            let s = query::get(&store, id).await.unwrap().unwrap();
            quiet(&store).await && s.waiting_for.as_deref() == Some("approve")
        },
        |_, _, _| Some(ok()),
        |_, _| ok(),
    )
    .await;
    assert_eq!(of(&w.ledger.undone, id), Vec::<usize>::new());
    approve(&w, id).await;
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    let s = query::get(&store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
    assert_eq!(of(&w.ledger.done, id), [0, 1, 3, 4]);
}
both_backends!(
    nothing_to_undo_tests,
    a_rewind_with_nothing_to_undo_asks_the_orchestrator
);

// What cannot be rewound is refused, saying why, with nothing changed: a step in
// flight, a step never taken, a step before the pivot once the pivot is done, a
// finished saga.
async fn rewinds_that_cannot_be_are_refused(backend: Backend) {
    let mut w = World::new(backend, vec![drafting()], 13).await;
    let store = w.store.clone();
    let id = w.start("drafting", json!({ "topic": "c" })).await;
    let refused = async |w: &World, to: &str, says: &str| {
        let before = query::steps(&w.store, id).await.unwrap();
        let err = rewind(w, &w.engine, id, to).await.unwrap_err();
        assert!(
            matches!(&err, Error::WrongState { why, .. } if why.contains(says)),
            "{to}: {err}"
        );
        assert_eq!(query::steps(&w.store, id).await.unwrap(), before);
        assert!(query::rewinds(&w.store, id).await.unwrap().is_empty());
    };
    refused(&w, "research", "in flight").await;
    refused(&w, "draft", "no step `draft`").await;
    approve(&w, id).await;
    // Paused once `send` (the pivot) is on its way: it answers, `notify` is held.
    w.pump_until(
        "`send` sent",
        async || query::steps(&store, id).await.unwrap().len() == 4,
        |_, _, _| Some(ok()),
        |_, _| ok(),
    )
    .await;
    pause(&w, id).await;
    w.pump_until(
        "`send` answered",
        async || quiet(&store).await,
        |_, _, _| Some(ok()),
        |_, _| ok(),
    )
    .await;
    refused(&w, "draft", "past its pivot").await;
    let mut tx = w.store.begin().await.unwrap();
    w.engine.resume(&mut tx, id).await.unwrap();
    tx.commit().await.unwrap();
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    assert_eq!(
        query::get(&store, id).await.unwrap().unwrap().state,
        SagaState::Completed
    );
    refused(&w, "draft", "only a running saga").await;
}
both_backends!(refused_tests, rewinds_that_cannot_be_are_refused);
