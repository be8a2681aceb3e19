//! Sleeps and waits that end by time: the saga parks, its wake-up is a timer message
//! due at its time, and it goes on when the message comes, however many stores (and
//! so processes) came and went in between.

use std::time::SystemTime;

use super::*;
use crate::Signal;

/// `a` (nothing to undo), a sleep of `sleep`, then the pivot `c`.
fn sleeper(sleep: Duration) -> SagaDefinition {
    Saga::<D>::builder("sleeper", 1)
        .step(Step::new("a", "a-agent").nothing_to_undo())
        .step(Step::sleep("nap", sleep))
        .pivot(Step::new("c", "c-agent"))
        .build()
        .unwrap()
}

/// Replies `ok` to every command waiting for `agent`; their count.
pub(super) async fn answer(store: &Store, agent: &str) -> usize {
    let commands = claim_of(store, agent).await;
    for command in &commands {
        let mut tx = store.begin().await.unwrap();
        let reply = protocol::reply(command, &ok()).unwrap().unwrap();
        tx.enqueue(&reply).await.unwrap();
        tx.commit().await.unwrap();
    }
    let seqs: Vec<i64> = commands.iter().map(|c| c.seq).collect();
    store.queue().mark_delivered("t", &seqs).await.unwrap();
    commands.len()
}

/// Handles what the orchestrator of `saga` has ready; how many messages.
pub(super) async fn orchestrate(engine: &Engine, store: &Store, saga: &str) -> Vec<Handled> {
    let mut out = Vec::new();
    for env in claim_of(store, &format!("saga.{saga}.v1")).await {
        let mut tx = store.begin().await.unwrap();
        out.push(engine.handle(&mut tx, &env).await.unwrap());
        tx.commit().await.unwrap();
        store.queue().mark_delivered("t", &[env.seq]).await.unwrap();
    }
    out
}

// A sleep parks the saga with nothing to deliver until its time; its wake-up comes
// then, through the outbox (so from any store opened on the database: here a second
// one, as after a restart), and the saga goes on to the pivot.
async fn a_sleep_parks_the_saga_and_wakes_it_at_its_time(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    let engine = Engine::new(vec![sleeper(Duration::from_millis(400))]).unwrap();
    let mut tx = store.begin().await.unwrap();
    let id = engine.start(&mut tx, "sleeper", &json!({})).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(answer(&store, "a-agent").await, 1);
    let before = agentsaga_core::clock::system_now_ms();
    assert_eq!(orchestrate(&engine, &store, "sleeper").await.len(), 1);

    let s = query::get(&store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Running);
    let steps = query::steps(&store, id).await.unwrap();
    let nap = &steps[1];
    assert_eq!(
        (nap.name.as_str(), nap.state),
        ("nap", StepState::Dispatched)
    );
    assert_eq!(nap.destination, "sleep:nap");
    let due = nap
        .wakes_at_ms
        .expect("a sleeping step's row holds its time");
    assert_eq!(s.sleeping_until_ms, Some(due));
    let sleeping = query::ListFilter {
        sleeping: true,
        ..Default::default()
    };
    assert_eq!(query::list(&store, &sleeping).await.unwrap().len(), 1);
    // However long it sleeps, a sleeping saga is not stalled.
    assert!(
        query::stalled(&store, Duration::ZERO, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        query::count_stalled(&store, Duration::ZERO).await.unwrap(),
        0
    );
    assert!(
        due >= before + 400 && due <= agentsaga_core::clock::system_now_ms() + 400,
        "{due}"
    );
    // Nothing is ready before the time: no wake-up, no command to the pivot.
    assert!(orchestrate(&engine, &store, "sleeper").await.is_empty());
    assert!(claim_of(&store, "c-agent").await.is_empty());

    // The process goes away; another store (another process) picks the saga up.
    store.close().await;
    let store = Store::connect(&url).await.unwrap();
    let engine = Engine::new(vec![sleeper(Duration::from_millis(400))]).unwrap();
    let mut woke = Vec::new();
    testing::wait_until("the wake-up is due", Duration::from_secs(30), async || {
        woke = orchestrate(&engine, &store, "sleeper").await;
        !woke.is_empty()
    })
    .await;
    assert!(
        agentsaga_core::clock::system_now_ms() >= due - 5,
        "woke before its time"
    );
    let steps = query::steps(&store, id).await.unwrap();
    assert_eq!(steps[1].state, StepState::Succeeded);
    assert_eq!(
        steps[1].compensation_state,
        Some(CompensationState::NotNeeded)
    );
    let sleeping = query::ListFilter {
        sleeping: true,
        ..Default::default()
    };
    assert!(query::list(&store, &sleeping).await.unwrap().is_empty());
    assert_eq!(answer(&store, "c-agent").await, 1);
    orchestrate(&engine, &store, "sleeper").await;
    let s = query::get(&store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed);
}

// `wait_for(…).or_after(…)`: a signal that comes in time is the wait's path (its fold
// runs, its wake-up is withdrawn); without one the step succeeds by time,
// its fold not called, and the saga goes on either way.
async fn a_wait_ends_by_its_signal_or_by_its_time(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let def = Saga::<D>::builder("replies", 1)
        .step(
            Step::wait_for("reply")
                .agents_may_signal()
                .or_after(Duration::from_millis(300))
                .on_reply(|d: &mut D, r: Value| d["replied"] = r),
        )
        .pivot(Step::new("c", "c-agent"))
        .build()
        .unwrap();
    let engine = Engine::new(vec![def]).unwrap();
    let start = async || {
        let mut tx = store.begin().await.unwrap();
        let id = engine.start(&mut tx, "replies", &json!({})).await.unwrap();
        tx.commit().await.unwrap();
        id
    };
    let signalled = start().await;
    let timed_out = start().await;
    let mut tx = store.begin().await.unwrap();
    Engine::signal(
        &mut tx,
        signalled,
        "reply",
        Signal::Approve(json!("thanks")),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    orchestrate(&engine, &store, "replies").await;
    let step = async |id| query::steps(&store, id).await.unwrap().remove(0);
    let data = async |id| query::data(&store, id).await.unwrap().unwrap();
    assert_eq!(step(signalled).await.state, StepState::Succeeded);
    assert_eq!(data(signalled).await["replied"], json!("thanks"));
    // The other waits on, and wakes after its time; the signalled one's wake-up was
    // withdrawn with its wait (only one wake-up comes, and nothing is ignored).
    assert_eq!(step(timed_out).await.state, StepState::Dispatched);
    let mut handled = Vec::new();
    testing::wait_until("the wait's time", Duration::from_secs(30), async || {
        handled.extend(orchestrate(&engine, &store, "replies").await);
        step(timed_out).await.state == StepState::Succeeded
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    handled.extend(orchestrate(&engine, &store, "replies").await);
    assert_eq!(handled.len(), 1, "{handled:?}");
    assert!(
        matches!(handled[0], Handled::Advanced { .. }),
        "{handled:?}"
    );
    assert_eq!(step(timed_out).await.state, StepState::Succeeded);
    let d = data(timed_out).await;
    assert!(
        d.get("replied").is_none(),
        "the fold ran without a reply: {d:?}"
    );
    assert_eq!(
        answer(&store, "c-agent").await,
        2,
        "both sagas went on to the pivot"
    );
}

// `sleep_until` reads its time from the data when the saga gets there; a time already
// past wakes the saga at once, and a time that cannot be computed fails the step
// like a command that cannot be built.
async fn sleep_until_takes_its_time_from_the_data(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let def = Saga::<D>::builder("until", 1)
        .step(Step::sleep_until("wait", |d: &D| {
            let at = d["at"].as_u64().unwrap_or(0);
            SystemTime::UNIX_EPOCH + Duration::from_millis(at)
        }))
        .pivot(Step::new("c", "c-agent"))
        .build()
        .unwrap();
    let engine = Engine::new(vec![def]).unwrap();
    let now = agentsaga_core::clock::system_now_ms();
    let mut ids = Vec::new();
    for at in [now - 60_000, now + 300] {
        let mut tx = store.begin().await.unwrap();
        ids.push(
            engine
                .start(&mut tx, "until", &json!({ "at": at }))
                .await
                .unwrap(),
        );
        tx.commit().await.unwrap();
    }
    let step = async |id| query::steps(&store, id).await.unwrap().remove(0);
    assert_eq!(step(ids[0]).await.wakes_at_ms, Some(now - 60_000));
    assert_eq!(step(ids[1]).await.wakes_at_ms, Some(now + 300));
    let mut handled = Vec::new();
    testing::wait_until(
        "the past time's wake-up",
        Duration::from_secs(30),
        async || {
            handled.extend(orchestrate(&engine, &store, "until").await);
            !handled.is_empty()
        },
    )
    .await;
    // The past one first (due at once), the other not before its time.
    assert_eq!(step(ids[0]).await.state, StepState::Succeeded);
    if agentsaga_core::clock::system_now_ms() < now + 300 {
        assert_eq!(step(ids[1]).await.state, StepState::Dispatched);
    }
    testing::wait_until("the later wake-up", Duration::from_secs(30), async || {
        orchestrate(&engine, &store, "until").await;
        step(ids[1]).await.state == StepState::Succeeded
    })
    .await;
    assert!(agentsaga_core::clock::system_now_ms() >= now + 300 - 5);
    assert_eq!(answer(&store, "c-agent").await, 2);
}

both_backends!(sleep_parks, a_sleep_parks_the_saga_and_wakes_it_at_its_time);
both_backends!(wait_or_after, a_wait_ends_by_its_signal_or_by_its_time);
both_backends!(sleep_until, sleep_until_takes_its_time_from_the_data);

// A plan's sleep (an LLM may plan a follow-up): `sleep_until` resolved from the input
// when the saga gets there, then the plan goes on.
async fn a_planned_saga_sleeps_until_its_input_says(backend: Backend) {
    let def = PlannedSaga::builder("planned_nap", 1)
        .destinations(["mail"])
        .retry(fast())
        .build()
        .unwrap();
    let mut w = World::new(backend, vec![def], 7).await;
    let at = agentsaga_core::clock::system_now_ms() + 300;
    let plan = Plan::new()
        .then(PlanStep::sleep_until("nap", json!({"$from": "/input/at"})))
        .then(PlanStep::command("send", "mail", json!("hi")).pivot());
    let start = PlanStart::new(plan, json!({ "at": at })).unwrap();
    let id = w
        .start("planned_nap", serde_json::to_value(start).unwrap())
        .await;
    let step = query::steps(&w.store, id).await.unwrap().remove(0);
    assert_eq!(
        (step.destination.as_str(), step.wakes_at_ms),
        ("sleep:nap", Some(at))
    );
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed);
    let steps = query::steps(&w.store, id).await.unwrap();
    assert!(
        steps[0].replied_at_ms.unwrap() >= at - 5,
        "woke before its time: {steps:?}"
    );
}
both_backends!(planned_sleep, a_planned_saga_sleeps_until_its_input_says);

// A `sleep_until` whose reference does not resolve to a time fails the sleep's own
// step when the saga gets there (not the step whose reply led there): the saga
// compensates with the reason. A sleep far beyond ten years wakes after ten.
async fn a_sleep_until_that_is_no_time_fails_its_step(backend: Backend) {
    let def = PlannedSaga::builder("planned_nap", 1)
        .destinations(["mail"])
        .retry(fast())
        .build()
        .unwrap();
    let mut w = World::new(backend, vec![def], 8).await;
    let plan = |at: Value| {
        let plan = Plan::new()
            .then(PlanStep::command("draft", "mail", json!("draft")).nothing_to_undo())
            .then(PlanStep::sleep_until("nap", json!({"$from": "/input/at"})))
            .then(PlanStep::command("send", "mail", json!("hi")).pivot());
        serde_json::to_value(PlanStart::new(plan, json!({ "at": at })).unwrap()).unwrap()
    };
    let id = w.start("planned_nap", plan(json!("tomorrow"))).await;
    w.pump(&[id], |_, _, _| Some(ok()), |_, _| ok()).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    let error = s.error.unwrap_or_default();
    assert!(
        error.contains("step `nap` failed: its time cannot be computed"),
        "{error}"
    );
    assert!(error.contains("not an RFC 3339 time"), "{error}");
    let steps = query::steps(&w.store, id).await.unwrap();
    assert_eq!(
        steps[0].state,
        StepState::Succeeded,
        "the draft is not blamed"
    );
    assert_eq!(steps[1].state, StepState::Failed);

    // Twenty years ahead (a time both backends store): it wakes after ten.
    let now = agentsaga_core::clock::system_now_ms();
    let far = now + 20 * 366 * 86_400_000;
    let id = w.start("planned_nap", plan(json!(far))).await;
    let store = w.store.clone();
    w.pump_until(
        "the draft's reply is applied",
        async || query::steps(&store, id).await.unwrap().len() == 2,
        |_, _, _| Some(ok()),
        |_, _| ok(),
    )
    .await;
    let nap = query::steps(&w.store, id).await.unwrap().remove(1);
    let ten_years = i64::try_from(crate::definition::wake::MAX_SLEEP.as_millis()).unwrap();
    let due = nap.wakes_at_ms.unwrap();
    assert!(
        due > now && due <= agentsaga_core::clock::system_now_ms() + ten_years,
        "{due}"
    );
}
both_backends!(
    sleep_until_no_time,
    a_sleep_until_that_is_no_time_fails_its_step
);

// A sleeping saga that is aborted is not listed as sleeping any more.
async fn an_aborted_sleeper_is_not_sleeping(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let engine = Engine::new(vec![sleeper(Duration::from_secs(3600))]).unwrap();
    let mut tx = store.begin().await.unwrap();
    let id = engine.start(&mut tx, "sleeper", &json!({})).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(answer(&store, "a-agent").await, 1);
    orchestrate(&engine, &store, "sleeper").await;
    let sleeping = query::ListFilter {
        sleeping: true,
        ..Default::default()
    };
    assert_eq!(query::list(&store, &sleeping).await.unwrap().len(), 1);
    let mut tx = store.begin().await.unwrap();
    engine.abort(&mut tx, id).await.unwrap();
    tx.commit().await.unwrap();
    assert!(query::list(&store, &sleeping).await.unwrap().is_empty());
    let s = query::get(&store, id).await.unwrap().unwrap();
    assert_eq!(s.sleeping_until_ms, None, "{s:?}");
}
both_backends!(aborted_sleeper, an_aborted_sleeper_is_not_sleeping);
