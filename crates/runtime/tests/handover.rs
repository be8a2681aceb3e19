//! Group commit and direct handover in a running runtime, on both backends: sagas
//! whose messages go from the transaction that writes them straight to their actors,
//! many hops to a commit, and the claim as the fallback past a destination's cap.

use std::time::Duration;

#[path = "support/echo.rs"]
mod echo;

use agentsaga_core::both_backends;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_runtime::Runtime;
use agentsaga_saga::{Saga, SagaState, Step};
use echo::Echo;
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Serialize, Deserialize)]
struct Order {
    n: u32,
}

// 60 sagas at once; `narrow` takes one delivery at a time, so at most one of its rows is
// handed over unfinished and the rest wait in the outbox for the claim. Every saga
// completes, every step's command is processed once, and nothing is left in flight.
async fn handover_with_claims_past_the_cap(backend: Backend) {
    let saga = Saga::<Order>::builder("order", 1)
        .step(Step::new("wide", "wide").compensate("wide", |_: &Order| json!("undo")))
        .step(Step::new("narrow", "narrow").compensate("narrow", |_: &Order| json!("undo")))
        .build()
        .unwrap();
    let rt = Runtime::builder()
        .database(fresh_url(backend).await)
        .agent(Echo("wide"))
        .agent(Echo("narrow"))
        .concurrency("narrow", 1)
        .saga(saga)
        .start()
        .await
        .unwrap();
    let mut starts = tokio::task::JoinSet::new();
    for n in 0..60 {
        let store = rt.store().clone();
        let engine = rt.engine().clone();
        starts.spawn(async move {
            let mut tx = store.begin().await.unwrap();
            let id = engine.start(&mut tx, "order", &Order { n }).await.unwrap();
            tx.commit().await.unwrap();
            id
        });
    }
    let ids = starts.join_all().await;
    for id in ids {
        let state = tokio::time::timeout(Duration::from_secs(60), rt.wait(id))
            .await
            .expect("the saga settles")
            .unwrap();
        assert_eq!(state, SagaState::Completed);
    }
    let stats = rt.relay_stats().expect("a relay");
    assert!(stats.handed_over > 0, "{stats:?}");
    let hops = rt.store().hop_stats();
    // One hop per step at least: the agent's, which also applies its reply to the
    // saga (the orchestrator's hop of an answer sent through the outbox is gone).
    assert!(hops.hops >= 60 * 2, "one hop per step at least: {hops:?}");
    // Each command processed once: one inbox row per command, for each agent.
    let inbox: Vec<(String, i64)> = agentsaga_core::Sql::new(
        "SELECT consumer, count(*) AS n FROM inbox WHERE consumer IN ('wide', 'narrow')
         GROUP BY consumer ORDER BY consumer",
    )
    .fetch_all(rt.store().reader())
    .await
    .unwrap()
    .iter()
    .map(|r| (r.text("consumer").unwrap(), r.int("n").unwrap()))
    .collect();
    assert_eq!(inbox, vec![("narrow".into(), 60), ("wide".into(), 60)]);
    rt.shutdown().await;
}
both_backends!(cap_tests, handover_with_claims_past_the_cap);
