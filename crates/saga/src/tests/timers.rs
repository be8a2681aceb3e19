//! Start timeouts (only untaken commands are withdrawn) and stalled sagas.

use super::*;

/// The saga of `start_timeout_tests`: one undoable step with a 50 ms start timeout and
/// a 10 ms work timeout (which, measured from the agent's start, never fires here).
fn start_bounded() -> SagaDefinition {
    Saga::<D>::builder("bounded", 1)
        .step(
            Step::new("a", "a-agent")
                .timeout(Duration::from_millis(10))
                .start_timeout(Duration::from_millis(50))
                .compensate("a-agent", |_: &D| json!("undo a")),
        )
        .build()
        .unwrap()
}

async fn handle_orchestrator(engine: &Engine, store: &Store) -> Vec<Handled> {
    let mut out = Vec::new();
    for env in claim_of(store, "saga.bounded.v1").await {
        let mut tx = store.begin().await.unwrap();
        out.push(engine.handle(&mut tx, &env).await.unwrap());
        tx.commit().await.unwrap();
    }
    out
}

// The step's `timeout` is not a timer from dispatch: a command that waits in a
// backlog far longer than its timeout is still carried out (the agent's clock starts
// when it takes the command). A command no agent took within its optional start
// timeout is withdrawn and the step counts as timed out.
async fn start_timeout_withdraws_only_untaken_commands(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let engine = Engine::new(vec![start_bounded()]).unwrap();

    // 1. Taken in time, answered after the start timeout passed: the reply wins,
    //    whichever of the two the orchestrator sees first.
    let mut tx = store.begin().await.unwrap();
    let taken = engine.start(&mut tx, "bounded", &json!({})).await.unwrap();
    tx.commit().await.unwrap();
    let command = claim_of(&store, "a-agent").await.remove(0);
    assert_eq!(command.header(header::TIMEOUT_MS), Some("10"));
    // The start timeout (50 ms) must pass by the database's clock, which holds the
    // timer's due time: wall-clock time, not tokio's. The reply comes after it.
    tokio::time::sleep(Duration::from_millis(80)).await;
    let mut tx = store.begin().await.unwrap();
    let reply = protocol::reply(&command, &ok()).unwrap().unwrap();
    tx.enqueue(&reply).await.unwrap();
    tx.commit().await.unwrap();
    store
        .queue()
        .mark_delivered("t", &[command.seq])
        .await
        .unwrap();
    // The timer (enqueued at start) is older than the reply: it comes first.
    let handled = handle_orchestrator(&engine, &store).await;
    assert_eq!(handled.len(), 2, "{handled:?}");
    assert!(matches!(handled[0], Handled::Ignored(_)), "{handled:?}");
    let s = query::get(&store, taken).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed);

    // 2. Never taken: withdrawn once the start timeout passes, and compensated.
    let mut tx = store.begin().await.unwrap();
    let untaken = engine.start(&mut tx, "bounded", &json!({})).await.unwrap();
    tx.commit().await.unwrap();
    // Nothing is handled before the start timeout's timer is due.
    let mut handled = Vec::new();
    testing::wait_until(
        "the start timeout's timer is handled",
        Duration::from_secs(30),
        async || {
            handled = handle_orchestrator(&engine, &store).await;
            !handled.is_empty()
        },
    )
    .await;
    assert_eq!(
        handled,
        vec![Handled::Advanced {
            saga: untaken,
            state: SagaState::Compensating
        }]
    );
    let s = query::get(&store, untaken).await.unwrap().unwrap();
    assert!(s.error.unwrap().contains("not started"));
    // The withdrawn command is gone: only its compensation is left for the agent.
    let left = claim_of(&store, "a-agent").await;
    assert_eq!(left.len(), 1);
    assert_eq!(
        left[0].header(header::KIND),
        Some(protocol::KIND_COMPENSATE)
    );
}
both_backends!(
    start_timeout_tests,
    start_timeout_withdraws_only_untaken_commands
);

// A saga whose reply was dead-lettered has nothing live left: it is stalled (and so is
// one with no progress past the threshold); one whose command is pending is not, nor
// one parked at a wait. Pages of the list follow each other by cursor.
async fn stalled_sagas_are_found(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let waits = Saga::<D>::builder("waits", 1)
        .step(Step::wait_for("approval"))
        .build()
        .unwrap();
    let engine = Engine::new(vec![trip(), waits]).unwrap();
    let start = async |name: &str| {
        let mut tx = store.begin().await.unwrap();
        let id = engine
            .start(&mut tx, name, &json!({ "trip": 1 }))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        id
    };
    let lost = start("trip").await;
    let moving = start("trip").await;
    let parked = start("waits").await;
    let hour = Duration::from_secs(3600);
    let stalled = async |t: Duration| -> Vec<SagaId> {
        let mut ids: Vec<SagaId> = query::stalled(&store, t, 0)
            .await
            .unwrap()
            .iter()
            .map(|s| s.id)
            .collect();
        ids.sort();
        ids
    };
    assert!(stalled(hour).await.is_empty(), "commands are pending");

    // `lost`'s flight agent answers; its reply is dead-lettered.
    let command = claim_of(&store, "flight-agent")
        .await
        .into_iter()
        .find(|e| e.header(header::SAGA_ID) == Some(&lost.to_string()))
        .unwrap();
    crate::testing::answer(&store, &command, &ok()).await;
    let reply = claim_of(&store, "saga.trip.v1").await.remove(0);
    crate::testing::dead_letter(&store, reply.seq, "lost").await;
    assert_eq!(stalled(hour).await, [lost]);
    // No progress past a threshold of zero: `moving` too; never the parked one.
    let mut both = vec![lost, moving];
    both.sort();
    assert_eq!(stalled(Duration::ZERO).await, both);
    assert!(!stalled(Duration::ZERO).await.contains(&parked));

    // Pages of one saga each, by cursor, newest first, cover all three once.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = query::list(
            &store,
            &query::ListFilter {
                limit: 1,
                after,
                ..query::ListFilter::default()
            },
        )
        .await
        .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(query::Cursor::after(last));
        let text = after.unwrap().to_string();
        assert_eq!(text.parse::<query::Cursor>().unwrap(), after.unwrap());
        seen.push(last.id);
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 3);
    let future = query::list(
        &store,
        &query::ListFilter {
            created_from_ms: Some(agentsaga_core::clock::system_now_ms() + 60_000),
            ..query::ListFilter::default()
        },
    )
    .await
    .unwrap();
    assert!(future.is_empty());
}
both_backends!(stalled_tests, stalled_sagas_are_found);

// A command delivered and not received here (it went to an agent in another service:
// no inbox row in this database) is an answer awaited: the saga is not stalled, nor
// counted, before the threshold, and is past it. Received here, the same saga is at
// once (its answer came in the same transaction and was lost).
async fn a_command_to_another_service_is_awaited_until_the_threshold(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let engine = Engine::new(vec![trip()]).unwrap();
    let mut tx = store.begin().await.unwrap();
    let id = engine
        .start(&mut tx, "trip", &json!({ "trip": 1 }))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let command = claim_of(&store, "flight-agent").await.remove(0);
    store
        .queue()
        .mark_delivered("t", &[command.seq])
        .await
        .unwrap();
    let hour = Duration::from_secs(3600);
    assert!(query::stalled(&store, hour, 0).await.unwrap().is_empty());
    assert_eq!(query::count_stalled(&store, hour).await.unwrap(), 0);
    let past = query::stalled(&store, Duration::ZERO, 0).await.unwrap();
    assert_eq!(past.iter().map(|s| s.id).collect::<Vec<_>>(), [id]);

    // Received here, and its answer lost: stalled at once.
    let mut tx = store.begin().await.unwrap();
    tx.receive(&command.destination, command.id).await.unwrap();
    tx.commit().await.unwrap();
    let now = query::stalled(&store, hour, 0).await.unwrap();
    assert_eq!(now.iter().map(|s| s.id).collect::<Vec<_>>(), [id]);
    assert_eq!(query::count_stalled(&store, hour).await.unwrap(), 1);
}
both_backends!(
    awaited_tests,
    a_command_to_another_service_is_awaited_until_the_threshold
);
