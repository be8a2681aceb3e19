//! The stall watch: a stalled saga (its reply dead-lettered) is counted in the
//! `agentsaga_sagas_stalled` gauge and warned of once.

#[path = "support/echo.rs"]
mod echo;
#[path = "support/scrape.rs"]
mod scrape;

use std::time::Duration;

use agentsaga_core::testing::{backends, fresh_url, wait_until};
use agentsaga_runtime::Runtime;
use agentsaga_saga::{Saga, SagaState, Step, query};
use echo::Echo;
use scrape::scrape;
use serde_json::{Value, json};

// A saga whose reply was dead-lettered is stalled: the stall watch counts it in the
// gauge and warns of it once, however many times it looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_saga_is_reported_once() {
    use agentsaga_core::{Store, header, testing};
    use agentsaga_saga::testing::{answer, dead_letter};
    use agentsaga_saga::{Engine, protocol};
    let url = fresh_url(backends()[0]).await;
    let saga = || {
        Saga::<Value>::builder("lost", 1)
            .step(Step::new("a", "flaky").compensate("flaky", |_: &Value| json!("undo")))
            .build()
            .unwrap()
    };
    // Before the runtime: the saga's command is answered and the reply dead-lettered.
    let store = Store::connect(&url).await.unwrap();
    let engine = Engine::new([saga()]).unwrap();
    let mut tx = store.begin().await.unwrap();
    let id = engine
        .start(&mut tx, "lost", &json!({ "n": 1 }))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let command = testing::claim(&store, &["flaky".to_owned()], 1)
        .await
        .remove(0);
    assert_eq!(
        command.header(header::SAGA_ID),
        Some(id.to_string().as_str())
    );
    answer(&store, &command, &protocol::StepOutcome::Ok(json!(1))).await;
    let reply = testing::claim(&store, &["saga.lost.v1".to_owned()], 1)
        .await
        .remove(0);
    dead_letter(&store, reply.seq, "lost on the way").await;

    let runtime = Runtime::builder()
        .store(store)
        .agent(Echo("flaky"))
        .saga(saga())
        .stalled_after(Duration::from_secs(3600), Duration::from_millis(50))
        .metrics("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .unwrap();
    let addr = runtime.metrics_addr().unwrap();
    // A saga that moves along is not stalled.
    let fine = runtime
        .start_saga("lost", &json!({ "n": 2 }))
        .await
        .unwrap();
    assert_eq!(runtime.wait(fine).await.unwrap(), SagaState::Completed);
    let reported = "the stalled saga is counted in the gauge";
    wait_until(reported, Duration::from_secs(30), async || {
        let m = tokio::task::spawn_blocking(move || scrape(addr))
            .await
            .unwrap();
        m.get("agentsaga_sagas_stalled") == Some(&1.0)
    })
    .await;
    // Many looks later, still one warning. The watch looks every 50 ms of wall-clock
    // time (the runtime's own tasks, a database beside): 400 ms is some eight looks, and
    // that no second warning comes has no condition to poll for.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let m = tokio::task::spawn_blocking(move || scrape(addr))
        .await
        .unwrap();
    assert_eq!(m["agentsaga_sagas_stalled"], 1.0, "{m:?}");
    assert_eq!(m["agentsaga_stalled_warnings_total"], 1.0, "{m:?}");
    let stalled = query::stalled(runtime.store(), Duration::from_secs(3600), 10)
        .await
        .unwrap();
    assert_eq!(stalled.iter().map(|s| s.id).collect::<Vec<_>>(), [id]);
    runtime.shutdown().await;
}
