//! Rewinds across the kinds of step: a child saga's, a planner's, an approval of a
//! command's.

use super::*;

// A rewind to a child saga's step: the child, completed, is undone as a whole (its
// steps compensated, latest first); the step then runs again as a new child (the old
// one stays, compensated, beside it), and the parent completes.
async fn a_rewound_child_step_runs_a_new_child(backend: Backend) {
    let mut w = World::new(
        backend,
        vec![
            super::super::children::booking(),
            super::super::children::travel(),
        ],
        14,
    )
    .await;
    let store = w.store.clone();
    let id = w.start("travel", json!({ "trip": "lisbon" })).await;
    pause(&w, id).await;
    w.pump_until(
        "`visa` answered",
        async || quiet(&store).await,
        |_, _, _| Some(ok()),
        |_, _| ok(),
    )
    .await;
    // One stage on: the child runs to its end; `expense` is held.
    let mut tx = w.store.begin().await.unwrap();
    w.engine.resume(&mut tx, id).await.unwrap();
    w.engine
        .pause(&mut tx, id, "ops-anna", "look")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    w.pump_until(
        "the child completed, `expense` held",
        async || quiet(&store).await,
        |_, _, _| Some(ok()),
        |_, _| ok(),
    )
    .await;
    let first = crate::engine::child_id(id, 1);
    assert_eq!(
        query::get(&store, first).await.unwrap().unwrap().state,
        SagaState::Completed
    );
    assert_eq!(
        rewind(&w, &w.engine, id, "book").await.unwrap(),
        SagaState::Compensating
    );
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    let s = query::get(&store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
    assert_eq!(
        query::get(&store, first).await.unwrap().unwrap().state,
        SagaState::Compensated,
        "the first child undone as a whole"
    );
    assert_eq!(of(&w.ledger.undone, first), [1, 0]);
    let filter = query::ListFilter {
        parent: Some(id),
        ..query::ListFilter::default()
    };
    let children = query::list(&store, &filter).await.unwrap();
    let states: Vec<_> = children.iter().map(|c| (c.id == first, c.state)).collect();
    assert_eq!(states.len(), 2, "{states:?}");
    assert!(
        states.contains(&(false, SagaState::Completed)),
        "{states:?}"
    );
    assert_eq!(
        of(&w.ledger.done, id),
        [0, 2],
        "`visa` and `expense` once each"
    );
}
both_backends!(child_tests, a_rewound_child_step_runs_a_new_child);

// A rewind to a planned saga's planner: the plan goes with the data as the saga
// began, the planner is asked again, and the saga runs its new plan.
async fn a_rewound_planner_plans_again(backend: Backend) {
    let def = PlannedSaga::builder("writer", 1)
        .destinations(["search", "book"])
        .planner(
            Step::new("plan", "planner")
                .command(|d: &Value| d.clone())
                .nothing_to_undo(),
        )
        .retry(fast())
        .build()
        .unwrap();
    let mut w = World::new(backend, vec![def], 15).await;
    let store = w.store.clone();
    let id = w.start("writer", json!({ "topic": "x" })).await;
    pause(&w, id).await;
    let plans = [
        Plan::new().then(super::super::replanning::undoable("find", "search", None)),
        Plan::new().then(super::super::replanning::undoable("book", "book", None)),
    ];
    let mut asked = 0;
    let mut planner = |env: &Envelope| {
        let step = env.header(protocol::STEP_NAME).unwrap_or_default();
        if step != "plan" {
            return Some(StepOutcome::Ok(json!(format!("{step} done"))));
        }
        asked += 1;
        Some(StepOutcome::Ok(
            serde_json::to_value(&plans[asked - 1]).unwrap(),
        ))
    };
    w.pump_until(
        "planned, its plan held",
        async || quiet(&store).await,
        |_, env, _| planner(env),
        |_, _| ok(),
    )
    .await;
    assert_eq!(
        rewind(&w, &w.engine, id, "plan").await.unwrap(),
        SagaState::Running
    );
    w.pump(&[id], |_, env, _| planner(env), |_, _| ok()).await;
    let s = query::get(&store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
    assert_eq!(asked, 2, "the planner is asked again");
    let names: Vec<String> = query::steps(&store, id)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        names,
        ["plan", "book"],
        "the new plan ran, the old one did not"
    );
    let data = query::data(&store, id).await.unwrap().unwrap();
    assert_eq!(data["results"]["book"], json!("book done"), "{data}");
    assert!(data["results"].get("find").is_none(), "{data}");
}
both_backends!(planned_tests, a_rewound_planner_plans_again);

// A rewind to a planned saga's approval of a command (`approve_before`), once the
// person approved it: the saga waits for a new approval (its wait's row and its
// signal's written afresh, not deleted after), and goes on once approved again.
async fn a_rewound_approval_waits_again(backend: Backend) {
    use super::super::guardrails::{pump_until_waiting, shop, shop_agent, shopping, signal};
    use crate::SignalSender;
    let mut w = World::new(backend, vec![shop()], 16).await;
    let store = w.store.clone();
    let id = w
        .start("shop", serde_json::to_value(shopping()).unwrap())
        .await;
    pump_until_waiting(&mut w, id, "approve.charge").await;
    pause(&w, id).await;
    signal(&w, id, SignalSender::Person, Signal::Approve(json!("ann")))
        .await
        .unwrap();
    w.pump_until(
        "approved, `charge` held",
        async || quiet(&store).await,
        |_, env, _| Some(shop_agent(env)),
        |_, _| ok(),
    )
    .await;
    assert_eq!(query::steps(&store, id).await.unwrap().len(), 2);
    let state = rewind(&w, &w.engine, id, "approve.charge").await.unwrap();
    assert_eq!(state, SagaState::Running, "nothing to undo");
    let s = query::get(&store, id).await.unwrap().unwrap();
    assert_eq!(s.waiting_for.as_deref(), Some("approve.charge"), "{s:?}");
    let steps = query::steps(&store, id).await.unwrap();
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert_eq!(steps[1].state, StepState::Dispatched);
    signal(&w, id, SignalSender::Person, Signal::Approve(json!("bob")))
        .await
        .unwrap();
    w.pump(&[id], |_, env, _| Some(shop_agent(env)), |_, _| ok())
        .await;
    let s = query::get(&store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
}
both_backends!(approval_tests, a_rewound_approval_waits_again);
