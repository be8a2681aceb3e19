//! Calls that wait: nobody blocked, a hundred at once, a long call keeping its lease, timeouts,
//! one key across redeliveries, a backlog longer than the timeout.

use super::*;

// While one agent waits on the outside world, 100 sagas of fast agents complete: the
// wait holds no transaction (on SQLite, not the single writer) and no actor.
async fn a_waiting_call_blocks_nobody(backend: Backend) {
    let (llm, calls, open) = Outside::new("llm", vec![Act::Gate]);
    let slow = Saga::<Job>::builder("slow", 1)
        .step(Step::new("ask", "llm").nothing_to_undo())
        .build()
        .unwrap();
    let fast = Saga::<Job>::builder("fast", 1)
        .step(Step::new("a", "a").compensate("a", |_: &Job| json!("undo")))
        .step(Step::new("b", "b").compensate("b", |_: &Job| json!("undo")))
        .build()
        .unwrap();
    let rt = builder(backend)
        .await
        .calling_agent(llm)
        .agent(Echo("a"))
        .agent(Echo("b"))
        .saga(slow)
        .saga(fast)
        .start()
        .await
        .unwrap();
    let waiting = rt.start_saga("slow", &Job { n: 0 }).await.unwrap();
    calls.until_in_flight("the slow call started", 1).await;
    let mut ids = Vec::new();
    for n in 0..100 {
        ids.push(rt.start_saga("fast", &Job { n }).await.unwrap());
    }
    for id in ids {
        assert_eq!(settle(&rt, id).await, SagaState::Completed);
    }
    // All 100 finished while the call still waits.
    assert_eq!(calls.in_flight.load(Ordering::SeqCst), 1);
    let s = query::get(rt.store(), waiting).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Running);
    open.send_replace(true);
    assert_eq!(settle(&rt, waiting).await, SagaState::Completed);
    assert_eq!(calls.started.load(Ordering::SeqCst), 1);
    rt.shutdown().await;
}
both_backends!(waiting_call_tests, a_waiting_call_blocks_nobody);

// 100 sagas whose agent waits: all 100 calls are in flight at once (with the default
// concurrency), so they take about one wait, not a hundred.
async fn hundred_waits_run_at_once(backend: Backend) {
    let (llm, calls, open) = Outside::new("llm", vec![Act::Gate]);
    let saga = one_step("ask", Step::new("ask", "llm").nothing_to_undo());
    let rt = start_calling(builder(backend), llm, saga).await;
    let started = std::time::Instant::now();
    let mut ids = Vec::new();
    for n in 0..100 {
        ids.push(rt.start_saga("ask", &Job { n }).await.unwrap());
    }
    // The gate opens only once every call waits at the same time: with a concurrency
    // below 100 this never happens, and the test fails on its bound.
    calls.until_in_flight("100 calls wait at once", 100).await;
    open.send_replace(true);
    for id in ids {
        assert_eq!(settle(&rt, id).await, SagaState::Completed);
    }
    assert_eq!(calls.peak.load(Ordering::SeqCst), 100);
    assert_eq!(calls.started.load(Ordering::SeqCst), 100);
    eprintln!("100 gated sagas took {:?}", started.elapsed());
    rt.shutdown().await;
}
both_backends!(hundred_waits_tests, hundred_waits_run_at_once);

// A call that outlives many leases (and the old 30 s delivery limit, scaled down) is
// neither retried nor dead-lettered while it runs: the relay renews its lease.
async fn a_long_call_keeps_its_lease(backend: Backend) {
    let (llm, calls, _open) = Outside::new("llm", vec![Act::Sleep(Duration::from_millis(1500))]);
    let think = Step::new("think", "llm").timeout(Duration::from_secs(30));
    let saga = one_step("long", think.nothing_to_undo());
    let lease = Duration::from_millis(200);
    let rt = start_calling(builder_with_lease(backend, lease), llm, saga).await;
    let id = rt.start_saga("long", &Job { n: 1 }).await.unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Completed);
    assert_eq!(calls.started.load(Ordering::SeqCst), 1, "called once");
    assert_eq!(calls.cancelled.load(Ordering::SeqCst), 0);
    let stats = rt.relay_stats().unwrap();
    assert_eq!(stats.retried, 0, "{stats:?}");
    assert_eq!(stats.dead, 0, "{stats:?}");
    assert_eq!(rt.store().admin().stats().await.unwrap().dead, 0);
    rt.shutdown().await;
}
both_backends!(long_call_tests, a_long_call_keeps_its_lease);

// Past its step's timeout a call is cancelled and the step follows the timeout rules
// (here: compensation, before the pivot). The compensation's idempotency key differs
// from the command's.
async fn a_call_past_its_timeout_is_cancelled(backend: Backend) {
    // The first call (the command) hangs; the next (the compensation) answers.
    let (llm, calls, _open) = Outside::new("llm", vec![Act::Gate, Act::Answer]);
    let book = Step::new("book", "llm")
        .timeout(Duration::from_millis(300))
        .retry(quick_retry());
    let saga = one_step("hangs", book.compensate("llm", |_: &Job| json!("cancel")));
    let rt = start_calling(builder(backend), llm, saga).await;
    let id = rt.start_saga("hangs", &Job { n: 1 }).await.unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Compensated);
    until("the hanging call is cancelled", || {
        calls.cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
    let seen = calls.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let (command, undo) = (&seen[0], &seen[1]);
    assert!(!command.2 && undo.2, "{seen:?}");
    assert_ne!(command.0, undo.0, "the undo has a key of its own");
    assert_eq!(command.0, format!("agentsaga:{id}:0:command"));
    assert_eq!(undo.0, format!("agentsaga:{id}:0:compensate"));
    let s = query::get(rt.store(), id).await.unwrap().unwrap();
    assert!(
        s.error.as_deref().unwrap_or_default().contains("timed out"),
        "{:?}",
        s.error
    );
    rt.shutdown().await;
}
both_backends!(timeout_tests, a_call_past_its_timeout_is_cancelled);

// The idempotency key stays the same across a redelivery of one message (after an
// infrastructure failure) and across a re-send of the step after its timeout (a new
// message): the outside world sees one key for one step.
async fn one_key_across_redelivery_and_resend(backend: Backend) {
    let (llm, calls, _open) = Outside::new("llm", vec![Act::Infra, Act::Gate, Act::Answer]);
    // A pivot is retried forward after a timeout: the command is sent again.
    let send = Step::new("send", "llm")
        .timeout(Duration::from_millis(300))
        .retry(quick_retry());
    let rt = start_calling(builder(backend), llm, one_pivot("send", send)).await;
    let id = rt.start_saga("send", &Job { n: 1 }).await.unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Completed);
    let seen = calls.seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    let key = format!("agentsaga:{id}:0:command");
    assert!(seen.iter().all(|(k, ..)| *k == key), "{seen:?}");
    assert_eq!(seen[0].1, seen[1].1, "a redelivery is the same message");
    assert_ne!(seen[1].1, seen[2].1, "a re-send is a new message");
    let by_id: HashMap<MessageId, usize> = seen.iter().fold(HashMap::new(), |mut m, s| {
        *m.entry(s.1).or_default() += 1;
        m
    });
    assert_eq!(by_id.len(), 2);
    rt.shutdown().await;
}
both_backends!(key_tests, one_key_across_redelivery_and_resend);

// Overload costs time, not work: a burst whose backlog lasts far longer than the
// steps' timeout completes, nothing timed out, because a step's timeout counts from
// when its agent starts on it, not from dispatch.
async fn a_backlog_longer_than_the_timeout_completes(backend: Backend) {
    let step = |name: &'static str| {
        Step::<Job>::new(name, name)
            .timeout(Duration::from_millis(200))
            .retry(quick_retry())
            .compensate(name, |_: &Job| json!("undo"))
    };
    let saga = Saga::<Job>::builder("burst", 1)
        .step(step("a"))
        .step(step("b"))
        .step(step("c"))
        .build()
        .unwrap();
    let rt = builder(backend)
        .await
        .agent(Echo("a"))
        .agent(Echo("b"))
        .agent(Echo("c"))
        .saga(saga)
        .start()
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut tx = rt.store().begin().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..400 {
        ids.push(
            rt.start_saga_in(&mut tx, "burst", &Job { n })
                .await
                .unwrap(),
        );
    }
    tx.commit().await.unwrap();
    rt.store().wake();
    let mut states = HashMap::new();
    for id in ids {
        *states.entry(settle(&rt, id).await).or_insert(0) += 1;
    }
    let took = started.elapsed();
    eprintln!("400 sagas with 200 ms step timeouts: {took:?}, {states:?}");
    assert_eq!(states, HashMap::from([(SagaState::Completed, 400)]));
    rt.shutdown().await;
}
both_backends!(backlog_tests, a_backlog_longer_than_the_timeout_completes);
