//! Idempotent starts, on both backends: a saga started with a caller's key is started
//! once, whoever asks again, racing or later, in the caller's transaction or not.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use agentsaga_core::both_backends;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_runtime::{Agent, AgentContext, Runtime, StepError};
use agentsaga_saga::{Saga, SagaState, Step, query};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Order {
    n: u32,
}

/// Counts the commands it handles.
struct Counter(Arc<AtomicU32>);

#[async_trait::async_trait]
impl Agent for Counter {
    type Command = Order;
    type Reply = u32;
    fn destination(&self) -> &str {
        "counter"
    }
    async fn handle(&self, _: &mut AgentContext<'_>, order: Order) -> Result<u32, StepError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(order.n)
    }
}

async fn runtime(backend: Backend, handled: &Arc<AtomicU32>, bound: Option<usize>) -> Runtime {
    let saga = Saga::<Order>::builder("order", 1)
        .step(
            Step::new("count", "counter")
                .command(|o: &Order| Order { n: o.n })
                .nothing_to_undo(),
        )
        .build()
        .unwrap();
    Runtime::builder()
        .database(fresh_url(backend).await)
        .agent(Counter(Arc::clone(handled)))
        .saga(saga)
        .max_sagas_in_flight(bound)
        .start()
        .await
        .unwrap()
}

async fn sagas_with_key(rt: &Runtime, key: &str) -> Vec<query::SagaSummary> {
    query::list(
        rt.store(),
        &query::ListFilter {
            key: Some(key.to_owned()),
            ..query::ListFilter::default()
        },
    )
    .await
    .unwrap()
}

// Once, then again later, then 8 at once: one saga, one id, one command handled.
async fn one_key_one_saga(backend: Backend) {
    let handled = Arc::new(AtomicU32::new(0));
    let rt = Arc::new(runtime(backend, &handled, None).await);
    let first = rt
        .start_saga_with_key("order", "order-7", &Order { n: 7 })
        .await
        .unwrap();
    assert_eq!(rt.wait(first).await.unwrap(), SagaState::Completed);
    let again = rt
        .start_saga_with_key("order", "order-7", &Order { n: 99 })
        .await
        .unwrap();
    assert_eq!(
        again, first,
        "a finished saga's key still answers with its id"
    );

    let racers: Vec<_> = (0..8)
        .map(|n| {
            let rt = Arc::clone(&rt);
            tokio::spawn(async move {
                rt.start_saga_with_key("order", "order-8", &Order { n })
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut ids = Vec::new();
    for r in racers {
        ids.push(r.await.unwrap());
    }
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(rt.wait(ids[0]).await.unwrap(), SagaState::Completed);

    // The same key under another saga name, or another key, is another saga.
    let other = rt
        .start_saga_with_key("order", "order-9", &Order { n: 9 })
        .await
        .unwrap();
    assert_ne!(other, first);
    assert_eq!(rt.wait(other).await.unwrap(), SagaState::Completed);

    assert_eq!(
        handled.load(Ordering::SeqCst),
        3,
        "three keys, three commands"
    );
    let listed = sagas_with_key(&rt, "order-8").await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, ids[0]);
    assert_eq!(listed[0].key.as_deref(), Some("order-8"));
    assert_eq!(
        query::get(rt.store(), first)
            .await
            .unwrap()
            .unwrap()
            .key
            .as_deref(),
        Some("order-7")
    );
}
both_backends!(one_key_one_saga_tests, one_key_one_saga);

// In the caller's transaction: two transactions racing for one key; the second waits
// for the first (PostgreSQL) or runs after it (SQLite's single writer) and gets its id.
// A rolled-back start frees its key.
async fn keys_in_the_callers_transaction(backend: Backend) {
    let handled = Arc::new(AtomicU32::new(0));
    let rt = Arc::new(runtime(backend, &handled, None).await);

    let mut tx = rt.store().begin().await.unwrap();
    let dropped = rt
        .start_saga_in_with_key(&mut tx, "order", "k", &Order { n: 1 })
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let mut tx = rt.store().begin().await.unwrap();
    let first = rt
        .start_saga_in_with_key(&mut tx, "order", "k", &Order { n: 2 })
        .await
        .unwrap();
    assert_ne!(first, dropped, "the rolled-back start left nothing behind");
    let second = tokio::spawn({
        let rt = Arc::clone(&rt);
        async move {
            let mut tx = rt.store().begin().await.unwrap();
            let id = rt
                .start_saga_in_with_key(&mut tx, "order", "k", &Order { n: 3 })
                .await
                .unwrap();
            tx.commit().await.unwrap();
            id
        }
    });
    // Time for the second to reach the key held by this uncommitted start and wait
    // there: from outside, waiting and not having begun look alike (no condition to
    // poll for). Either way, it must get the first's id.
    tokio::time::sleep(Duration::from_millis(100)).await;
    tx.commit().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second, first);
    assert_eq!(rt.wait(first).await.unwrap(), SagaState::Completed);
    assert_eq!(handled.load(Ordering::SeqCst), 1);
    assert_eq!(sagas_with_key(&rt, "k").await.len(), 1);
}
both_backends!(callers_transaction_tests, keys_in_the_callers_transaction);

// A start that waits for room (admission) holds its key too; bad keys are typed errors
// and write nothing.
async fn waiting_starts_and_bad_keys(backend: Backend) {
    let handled = Arc::new(AtomicU32::new(0));
    let rt = runtime(backend, &handled, Some(1)).await;
    let mut tx = rt.store().begin().await.unwrap();
    let a = rt
        .start_saga_in_with_key(&mut tx, "order", "a", &Order { n: 1 })
        .await
        .unwrap();
    let b = rt
        .start_saga_in_with_key(&mut tx, "order", "b", &Order { n: 2 })
        .await
        .unwrap();
    let b_again = rt
        .start_saga_in_with_key(&mut tx, "order", "b", &Order { n: 3 })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(b_again, b, "a waiting start answers with its id");
    for id in [a, b] {
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(30), rt.wait(id))
                .await
                .unwrap()
                .unwrap(),
            SagaState::Completed
        );
    }
    assert_eq!(handled.load(Ordering::SeqCst), 2);

    for bad in [String::new(), "x".repeat(agentsaga_saga::MAX_KEY_BYTES + 1)] {
        let err = rt
            .start_saga_with_key("order", &bad, &Order { n: 4 })
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                agentsaga_runtime::Error::Saga(agentsaga_saga::Error::InvalidKey { .. })
            ),
            "{err}"
        );
    }
    let all = query::list(rt.store(), &query::ListFilter::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 2, "the refused starts wrote nothing");
}
both_backends!(waiting_and_bad_key_tests, waiting_starts_and_bad_keys);
