//! Starts beyond the bound wait their turn: single starts, batches, batches in a hop.

use super::*;
use tokio::sync::oneshot;

async fn a_burst_beyond_the_bound_waits_its_turn(backend: Backend) {
    let GatedRuntime {
        rt,
        open,
        in_flight,
        peak,
        order,
    } = gated_runtime(backend, 10).await;
    // 50 starts in the caller's transaction: all accepted, 10 started, 40 waiting.
    let mut tx = rt.store().begin().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..50 {
        ids.push(rt.start_saga_in(&mut tx, "job", &Job { n }).await.unwrap());
    }
    tx.commit().await.unwrap();
    assert_eq!(waiting(&rt).await, 40);
    until("10 calls wait", async || {
        in_flight.load(Ordering::SeqCst) == 10
    })
    .await;
    // No room: a try is refused with a typed error and writes nothing; a plain start
    // waits its turn behind the 40.
    let busy = rt.try_start_saga("job", &Job { n: 99 }).await.unwrap_err();
    assert!(busy.is_busy(), "{busy}");
    assert_eq!(waiting(&rt).await, 40);
    let rt = Arc::new(rt);
    let late = tokio::spawn({
        let rt = Arc::clone(&rt);
        async move { rt.start_saga("job", &Job { n: 50 }).await.unwrap() }
    });
    until("the late start is stored", async || {
        waiting(&rt).await == 41
    })
    .await;
    assert!(!late.is_finished(), "start_saga returned while it waits");
    // Still ten: the bound held while the rest waited.
    assert_eq!(in_flight.load(Ordering::SeqCst), 10);
    open.send_replace(true);
    all_complete(&rt, &ids).await;
    let late = tokio::time::timeout(Duration::from_secs(60), late)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rt.wait(late).await.unwrap(), SagaState::Completed);
    assert_eq!(peak.load(Ordering::SeqCst), 10, "never more than the bound");
    assert_eq!(waiting(&rt).await, 0);
    // The first ten started first. The late start was admitted after all 40 that
    // waited before it; only sagas in flight beside it (at most 9) may have reached
    // the agent after it.
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), 51);
    let mut first: Vec<u32> = order[..10].to_vec();
    first.sort_unstable();
    assert_eq!(first, (0..10).collect::<Vec<_>>());
    let late_at = order.iter().position(|&n| n == 50).unwrap();
    assert!(late_at >= 41, "the late start ran {late_at}th: {order:?}");
    Arc::into_inner(rt).unwrap().shutdown().await;
}
both_backends!(burst_tests, a_burst_beyond_the_bound_waits_its_turn);

/// `start_sagas_in` decides a batch as that many `start_saga_in`s would: within the
/// bound started, the rest waiting in order; a rolled-back batch leaves nothing.
async fn a_batch_of_starts_is_admitted_like_single_starts(backend: Backend) {
    let GatedRuntime {
        rt,
        open,
        in_flight,
        peak,
        order,
    } = gated_runtime(backend, 10).await;
    // 30 starts in one call: 10 started, 20 waiting, the ids in the data's order.
    let jobs: Vec<Job> = (0..30).map(|n| Job { n }).collect();
    let mut tx = rt.store().begin().await.unwrap();
    let ids = rt.start_sagas_in(&mut tx, "job", &jobs).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ids.len(), 30);
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 30, "every start has its own saga");
    assert_eq!(waiting(&rt).await, 20);
    until("10 calls wait", async || {
        in_flight.load(Ordering::SeqCst) == 10
    })
    .await;
    open.send_replace(true);
    all_complete(&rt, &ids).await;
    assert_eq!(peak.load(Ordering::SeqCst), 10, "never more than the bound");
    assert_eq!(waiting(&rt).await, 0);
    let done = order.lock().unwrap().clone();
    assert_eq!(done.len(), 30, "each saga's step ran once: {done:?}");
    let mut first: Vec<u32> = done[..10].to_vec();
    first.sort_unstable();
    assert_eq!(
        first,
        (0..10).collect::<Vec<_>>(),
        "the first ten started first"
    );
    // An empty batch starts nothing; an unknown saga name is a typed error.
    let mut tx = rt.store().begin().await.unwrap();
    let none: &[Job] = &[];
    assert!(
        rt.start_sagas_in(&mut tx, "job", none)
            .await
            .unwrap()
            .is_empty()
    );
    let unknown = rt
        .start_sagas_in(&mut tx, "no_such_saga", &[Job { n: 0 }])
        .await
        .unwrap_err();
    assert!(
        matches!(
            unknown,
            agentsaga_runtime::Error::Saga(agentsaga_saga::Error::UnknownSaga(_))
        ),
        "{unknown:?}"
    );
    tx.rollback().await.unwrap();
    // A batch rolled back: no saga, no waiting start, no call.
    let mut tx = rt.store().begin().await.unwrap();
    let gone = rt
        .start_sagas_in(&mut tx, "job", &[Job { n: 1000 }, Job { n: 1001 }])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(gone.len(), 2);
    for id in &gone {
        let found = agentsaga_saga::query::get(rt.store(), *id).await.unwrap();
        assert!(found.is_none(), "a saga of a rolled-back batch exists");
    }
    assert_eq!(waiting(&rt).await, 0);
    // Time for a rolled-back start to (wrongly) reach the agent: that nothing more
    // runs has no condition to poll for.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(order.lock().unwrap().len(), 30, "a rolled-back start ran");
    rt.shutdown().await;
}
both_backends!(
    batch_tests,
    a_batch_of_starts_is_admitted_like_single_starts
);

/// A batch of starts in a hop (on SQLite a turn in the shared transaction of the hops
/// running, behind a hop held open): committed, its sagas run to the end; rolled back
/// (also when it is not the first hop of its transaction), it leaves no saga, no
/// waiting start and no command, and the hops beside it are kept.
async fn a_batch_of_starts_in_a_hop(backend: Backend) {
    let GatedRuntime {
        rt, open, order, ..
    } = gated_runtime(backend, 100).await;
    open.send_replace(true);
    let rt = Arc::new(rt);
    // A turn held open in SQLite's lane: the batches' `begin`s find hops running and
    // queue behind it, as a user's would under load.
    let first = rt.store().lane_turn().await.unwrap();
    // Each batch's hop says when it has asked for its turn (polled once: on SQLite,
    // queued behind the first hop; on PostgreSQL, maybe open already, its sender
    // dropped).
    let batch = |from: u32, keep: bool| {
        let rt = Arc::clone(&rt);
        let (queued, is_queued) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let jobs: Vec<Job> = (from..from + 5).map(|n| Job { n }).collect();
            let mut opening = std::pin::pin!(rt.store().begin());
            let hop = tokio::select! {
                biased;
                hop = &mut opening => hop,
                () = std::future::ready(()) => {
                    let _ = queued.send(());
                    opening.await
                }
            };
            let mut hop = hop.unwrap();
            let ids = rt.start_sagas_in(&mut hop, "job", &jobs).await.unwrap();
            if keep {
                hop.commit().await.unwrap();
            } else {
                hop.rollback().await.expect("rollback");
            }
            ids
        });
        (task, is_queued)
    };
    let ((kept, a), (dropped, b), (kept_too, c)) =
        (batch(0, true), batch(100, false), batch(200, true));
    // The first hop commits once the three have asked for their turn (the assertions
    // hold whether they queued behind it or not).
    for is_queued in [a, b, c] {
        let _ = tokio::time::timeout(Duration::from_secs(30), is_queued).await;
    }
    first.commit().await.unwrap();
    let (kept, dropped, kept_too) = (
        kept.await.unwrap(),
        dropped.await.unwrap(),
        kept_too.await.unwrap(),
    );
    let started: Vec<SagaId> = kept.iter().chain(&kept_too).copied().collect();
    all_complete(&rt, &started).await;
    for id in &dropped {
        let found = agentsaga_saga::query::get(rt.store(), *id).await.unwrap();
        assert!(found.is_none(), "a saga of a rolled-back hop exists");
    }
    assert_eq!(waiting(&rt).await, 0);
    // Time for a dropped saga's step, or a second run of a kept one, to (wrongly) reach
    // the agent: that nothing more runs has no condition to poll for.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut ran = order.lock().unwrap().clone();
    ran.sort_unstable();
    let expected: Vec<u32> = (0..5).chain(200..205).collect();
    assert_eq!(
        ran, expected,
        "each kept saga's step ran once, no dropped one's"
    );
    Arc::into_inner(rt).unwrap().shutdown().await;
}
both_backends!(hop_batch_tests, a_batch_of_starts_in_a_hop);
