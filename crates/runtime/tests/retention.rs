//! Retention, on both backends: the runtime prunes delivered outbox rows, inbox
//! records and (when asked) finished sagas on its own; it refuses an inbox retention
//! shorter than redelivery can take; `prune_finished` never touches running sagas.

#[path = "support/echo.rs"]
mod echo;

use std::time::Duration;

use agentsaga_core::testing::{Backend, fresh_url, wait_until};
use agentsaga_core::{RetryPolicy, both_backends};
use agentsaga_relay::RelayConfig;
use agentsaga_runtime::{Error, Retention, Runtime};
use agentsaga_saga::{Saga, SagaState, Step, query};
use echo::Echo;
use serde_json::{Value, json};

fn relay() -> RelayConfig {
    RelayConfig::default()
        .lease(Duration::from_millis(200))
        .retry(RetryPolicy::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
            3,
        ))
}

fn saga() -> agentsaga_saga::SagaDefinition {
    Saga::<Value>::builder("echo", 1)
        .step(Step::new("a", "echo").compensate("echo", |_: &Value| json!("undo")))
        .step(Step::new("b", "echo").nothing_to_undo())
        .build()
        .unwrap()
}

async fn the_runtime_prunes_on_its_own(backend: Backend) {
    let rt = Runtime::builder()
        .database(fresh_url(backend).await)
        .relay_config(relay())
        .retention(
            Retention::default()
                .delivered(Some(Duration::ZERO))
                .inbox(Some(Duration::from_secs(2)))
                .finished_sagas(Some(Duration::ZERO))
                .every(Duration::from_millis(100)),
        )
        .agent(Echo("echo"))
        .saga(saga())
        .start()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(rt.start_saga("echo", &json!({ "n": n })).await.unwrap());
    }
    for id in &ids {
        // A pruned saga is gone: `wait` answers not found, which is also "done".
        match tokio::time::timeout(Duration::from_secs(30), rt.wait(*id))
            .await
            .unwrap()
        {
            Ok(state) => assert_eq!(state, SagaState::Completed),
            Err(Error::Saga(agentsaga_saga::Error::NotFound(_))) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let pruned = "finished sagas and delivered rows are pruned";
    wait_until(pruned, Duration::from_secs(30), async || {
        let sagas: u64 = query::count_by_state(rt.store())
            .await
            .unwrap()
            .iter()
            .map(|(_, n)| n)
            .sum();
        let delivered = rt.store().admin().stats().await.unwrap().delivered;
        (sagas, delivered) == (0, 0)
    })
    .await;
    rt.shutdown().await;
}
both_backends!(pruning_tests, the_runtime_prunes_on_its_own);

async fn prune_finished_spares_the_unfinished(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = agentsaga_core::Store::connect(&url).await.unwrap();
    let engine = agentsaga_saga::Engine::new([saga()]).unwrap();
    let mut tx = store.begin().await.unwrap();
    let running = engine.start(&mut tx, "echo", &json!({})).await.unwrap();
    tx.commit().await.unwrap();
    // Nothing delivers its command: it stays running, however old. It ages by the
    // database's clock (wall-clock time, which tokio's paused clock cannot move) past
    // the prune's age of zero.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pruned = query::prune_finished(&store, Duration::ZERO).await.unwrap();
    assert_eq!(pruned, query::Pruned::default());
    assert_eq!(
        query::get(&store, running).await.unwrap().unwrap().state,
        SagaState::Running
    );
}
both_backends!(spare_tests, prune_finished_spares_the_unfinished);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_retention_shorter_than_redelivery_is_refused() {
    let err = Runtime::builder()
        .database("sqlite::memory:")
        .relay_config(relay())
        .retention(Retention::default().inbox(Some(Duration::from_millis(10))))
        .agent(Echo("echo"))
        .saga(saga())
        .start()
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(&err, Error::Config(m) if m.contains("redelivery")),
        "{err}"
    );
}
