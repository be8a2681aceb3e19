//! Admission control, on both backends: a burst beyond a saga name's bound waits in
//! order and loses nothing; `try_start_saga` answers busy; `start_saga` waits its turn.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_core::{StoreConfig, both_backends};
use agentsaga_runtime::{AgentContext, CallContext, CallingAgent, Runtime, StepError};
use agentsaga_saga::{Engine, Saga, SagaId, SagaState, Step};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

#[derive(Serialize, Deserialize)]
struct Job {
    n: u32,
}

/// Waits at a gate; records the order of the jobs it was given and its peak
/// concurrency (one step per saga: the sagas in flight).
struct Gated {
    gate: watch::Receiver<bool>,
    in_flight: Arc<AtomicU32>,
    peak: Arc<AtomicU32>,
    order: Arc<Mutex<Vec<u32>>>,
}

#[async_trait::async_trait]
impl CallingAgent for Gated {
    type Command = Job;
    type Output = u32;
    type Reply = u32;
    fn destination(&self) -> &str {
        "gated"
    }
    async fn call(&self, _: &CallContext<'_>, job: &Job) -> Result<u32, StepError> {
        self.order.lock().unwrap().push(job.n);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        let mut gate = self.gate.clone();
        let _ = gate.wait_for(|open| *open).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(job.n)
    }
    async fn record(&self, _: &mut AgentContext<'_>, _: Job, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

async fn until(what: &str, cond: impl AsyncFnMut() -> bool) {
    agentsaga_core::testing::wait_until(what, Duration::from_secs(60), cond).await;
}

async fn waiting(rt: &Runtime) -> u64 {
    Engine::waiting_starts(rt.store())
        .await
        .unwrap()
        .iter()
        .map(|(_, n)| n)
        .sum()
}

/// A runtime whose saga `job` has one gated step and at most `bound` sagas in flight.
struct GatedRuntime {
    rt: Runtime,
    open: watch::Sender<bool>,
    in_flight: Arc<AtomicU32>,
    peak: Arc<AtomicU32>,
    order: Arc<Mutex<Vec<u32>>>,
}

async fn gated_runtime(backend: Backend, bound: usize) -> GatedRuntime {
    gated_runtime_at(fresh_url(backend).await, bound, StoreConfig::default()).await
}

/// [`gated_runtime`] on the database at `url`, with `config`.
async fn gated_runtime_at(url: String, bound: usize, config: StoreConfig) -> GatedRuntime {
    let (open, gate) = watch::channel(false);
    let in_flight = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let saga = Saga::<Job>::builder("job", 1)
        .step(
            Step::new("work", "gated")
                .command(|j: &Job| Job { n: j.n })
                .nothing_to_undo(),
        )
        .build()
        .unwrap();
    let rt = Runtime::builder()
        .database(url)
        .store_config(config)
        .calling_agent(Gated {
            gate,
            in_flight: Arc::clone(&in_flight),
            peak: Arc::clone(&peak),
            order: Arc::clone(&order),
        })
        .saga(saga)
        .saga(
            // Its command is its data, whatever its size.
            Saga::<serde_json::Value>::builder("copy", 1)
                .step(
                    Step::new("work", "gated")
                        .command(|v: &serde_json::Value| v.clone())
                        .nothing_to_undo(),
                )
                .build()
                .unwrap(),
        )
        .max_sagas_in_flight(Some(bound))
        .start()
        .await
        .unwrap();
    GatedRuntime {
        rt,
        open,
        in_flight,
        peak,
        order,
    }
}

/// Waits for every saga of `ids` to complete.
async fn all_complete(rt: &Runtime, ids: &[SagaId]) {
    for id in ids {
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(60), rt.wait(*id))
                .await
                .unwrap()
                .unwrap(),
            SagaState::Completed
        );
    }
}

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
    let first = rt.store().hop().await.unwrap();
    let batch = |from: u32, keep: bool| {
        let rt = Arc::clone(&rt);
        tokio::spawn(async move {
            let jobs: Vec<Job> = (from..from + 5).map(|n| Job { n }).collect();
            let mut hop = rt.store().hop().await.unwrap();
            let ids = rt.start_sagas_in(&mut hop, "job", &jobs).await.unwrap();
            if keep {
                hop.commit().await.unwrap();
            } else {
                hop.rollback();
            }
            ids
        })
    };
    let (kept, dropped, kept_too) = (batch(0, true), batch(100, false), batch(200, true));
    // Give the three time to queue behind the first hop (on SQLite): the assertions
    // hold whether they did or not.
    tokio::time::sleep(Duration::from_millis(200)).await;
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

/// Rows written so far: sagas, outbox rows (any state), waiting starts.
async fn written(rt: &Runtime) -> (u64, u64, u64) {
    let sagas = agentsaga_saga::query::count_by_state(rt.store())
        .await
        .unwrap()
        .iter()
        .map(|(_, n)| n)
        .sum();
    let s = rt.store().admin().stats().await.unwrap();
    (
        sagas,
        s.pending + s.in_flight + s.delivered + s.dead,
        waiting(rt).await,
    )
}

/// A start that must wait for room is checked in full before it is stored: data that
/// does not decode as the saga's input, or a first command over the store's message
/// size limit, is refused with a typed error and nothing is written (its idempotency
/// key stays free); the starts behind it are not held up.
async fn a_bad_waiting_start_is_refused(backend: Backend) {
    let config = StoreConfig::default().max_message_bytes(1024);
    let GatedRuntime { rt, open, .. } = gated_runtime_at(fresh_url(backend).await, 1, config).await;
    let first = rt.start_saga("job", &Job { n: 0 }).await.unwrap();
    let copy = rt.start_saga("copy", &json!({"n": 10})).await.unwrap();
    let mut tx = rt.store().begin().await.unwrap();
    rt.start_saga_in(&mut tx, "job", &Job { n: 1 })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(waiting(&rt).await, 1, "the bound is full: starts wait");
    let before = written(&rt).await;

    let mut tx = rt.store().begin().await.unwrap();
    let undecodable = rt
        .start_saga_in_with_key(&mut tx, "job", "k-1", &json!({"n": "not a number"}))
        .await
        .unwrap_err();
    assert!(
        matches!(
            undecodable,
            agentsaga_runtime::Error::Saga(agentsaga_saga::Error::Data(_))
        ),
        "{undecodable:?}"
    );
    let oversized = rt
        .start_saga_in_with_key(
            &mut tx,
            "copy",
            "k-2",
            &json!({"n": 2, "pad": "x".repeat(2000)}),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            oversized,
            agentsaga_runtime::Error::Saga(agentsaga_saga::Error::Store(
                agentsaga_core::Error::PayloadTooLarge { limit: 1024, .. }
            ))
        ),
        "{oversized:?}"
    );
    // The caller's transaction goes on and commits: the refusals left nothing in it.
    let behind = rt
        .start_saga_in_with_key(&mut tx, "job", "k-1", &Job { n: 3 })
        .await
        .unwrap();
    let behind_copy = rt
        .start_saga_in_with_key(&mut tx, "copy", "k-2", &json!({"n": 11}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let (sagas, rows, waits) = written(&rt).await;
    assert_eq!((sagas, rows, waits), (before.0, before.1, before.2 + 2));
    let batch = {
        let mut tx = rt.store().begin().await.unwrap();
        let e = rt
            .start_sagas_in(&mut tx, "job", &[json!({"n": 4}), json!({"n": []})])
            .await
            .unwrap_err();
        tx.commit().await.unwrap();
        e
    };
    assert!(
        matches!(
            batch,
            agentsaga_runtime::Error::Saga(agentsaga_saga::Error::Data(_))
        ),
        "{batch:?}"
    );
    assert_eq!(
        written(&rt).await,
        (sagas, rows, waits),
        "a refused batch writes nothing"
    );

    open.send_replace(true);
    all_complete(&rt, &[first, copy, behind, behind_copy]).await;
    assert_eq!(waiting(&rt).await, 0);
    assert!(
        agentsaga_saga::Engine::set_aside_starts(rt.store())
            .await
            .unwrap()
            .is_empty()
    );
    rt.shutdown().await;
}
both_backends!(bad_waiting_start_tests, a_bad_waiting_start_is_refused);

/// A stored start that cannot begin when its turn comes (here: accepted while the saga
/// took any JSON, then a deploy made its input a `Job`) is set aside with the reason;
/// the starts behind it run; `start_saga` and `wait` on it answer a typed error; an
/// operator removes it.
async fn a_start_that_became_unstartable_is_set_aside(backend: Backend) {
    let url = fresh_url(backend).await;
    // Before the deploy: the saga takes any JSON. One saga in flight (its command is
    // left pending), then four starts wait: a bad one first.
    let store = agentsaga_core::Store::connect(&url).await.unwrap();
    let before = Saga::<serde_json::Value>::builder("job", 1)
        .step(
            Step::new("work", "gated")
                .command(|j: &serde_json::Value| j.clone())
                .nothing_to_undo(),
        )
        .build()
        .unwrap();
    let engine = Engine::new([before]).unwrap().with_max_in_flight(Some(1));
    let mut tx = store.begin().await.unwrap();
    let mut good = Vec::new();
    let mut accepted = Vec::new();
    for data in [
        json!({"n": 0}),
        json!({"n": "zero"}),
        json!({"n": 1}),
        json!({"n": 2}),
        json!({"n": 3}),
    ] {
        accepted.push(engine.accept(&mut tx, "job", data).await.unwrap());
    }
    tx.commit().await.unwrap();
    store.close().await;
    assert!(matches!(accepted[0], agentsaga_saga::Accepted::Started(_)));
    assert!(
        accepted[1..]
            .iter()
            .all(|a| matches!(a, agentsaga_saga::Accepted::Waiting(_)))
    );
    let bad = accepted[1].id();
    good.push(accepted[0].id());
    good.extend(accepted[2..].iter().map(|a| a.id()));

    // After the deploy: `Job`, one in flight.
    let GatedRuntime {
        rt, open, order, ..
    } = gated_runtime_at(url, 1, StoreConfig::default()).await;
    open.send_replace(true);
    all_complete(&rt, &good).await;
    let mut ran = order.lock().unwrap().clone();
    ran.sort_unstable();
    assert_eq!(ran, vec![0, 1, 2, 3], "the starts behind the bad one ran");
    assert_eq!(waiting(&rt).await, 0);
    let aside = Engine::set_aside_starts(rt.store()).await.unwrap();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(aside[0].id, bad);
    assert_eq!(aside[0].name, "job");
    assert_eq!(aside[0].data, json!({"n": "zero"}));
    assert!(aside[0].error.contains("saga data"), "{}", aside[0].error);
    // Whoever waits for it learns why.
    let err = rt.wait(bad).await.unwrap_err();
    assert!(
        matches!(
            &err,
            agentsaga_runtime::Error::Saga(agentsaga_saga::Error::StartSetAside { id, .. }) if *id == bad
        ),
        "{err:?}"
    );
    // An operator removes it; removing it again, or a start that is not set aside, is
    // refused.
    let mut tx = rt.store().begin().await.unwrap();
    Engine::remove_set_aside(&mut tx, bad).await.unwrap();
    assert!(matches!(
        Engine::remove_set_aside(&mut tx, bad).await,
        Err(agentsaga_saga::Error::NotFound(_))
    ));
    assert!(matches!(
        Engine::remove_set_aside(&mut tx, good[0]).await,
        Err(agentsaga_saga::Error::NotFound(_))
    ));
    tx.commit().await.unwrap();
    assert!(
        Engine::set_aside_starts(rt.store())
            .await
            .unwrap()
            .is_empty()
    );
    rt.shutdown().await;
}
both_backends!(
    set_aside_tests,
    a_start_that_became_unstartable_is_set_aside
);
