//! Outcomes: retries with backoff, dead letters, rejects, notices.

use std::time::Duration;

use agentsaga_core::queue::Claim;
use agentsaga_core::testing::Backend;
use agentsaga_core::{DeliveryFailed, RetryPolicy, header};
use agentsaga_relay::Delivery;
use serde_json::json;

use crate::support::{Scripted, config, enqueue, msg, start, store, wait_delivered, wait_until};

async fn retries_with_backoff_then_delivered(backend: Backend) {
    let store = store(backend).await;
    let t = Scripted::new();
    t.script(
        "a",
        [
            Delivery::retry("down 1"),
            Delivery::retry("down 2"),
            Delivery::Delivered,
        ],
    );
    let relay = start(&store, &["a"], &t, config()).await;
    let ids = enqueue(&store, &[msg("a", Some("k"), json!(1))]).await;
    wait_delivered(&relay, 1).await;

    let calls = t.calls_for(ids[0]);
    let attempts: Vec<u32> = calls.iter().map(|c| c.envelope.attempts).collect();
    assert_eq!(attempts, [1, 2, 3]);
    assert_eq!(relay.stats().retried, 2);
    assert_eq!(store.admin().stats().await.unwrap().delivered, 1);

    // The transport's own `after` holds the row back (by the database's clock).
    t.script(
        "a",
        [
            Delivery::retry_after("busy", Duration::from_millis(300)),
            Delivery::Delivered,
        ],
    );
    let ids = enqueue(&store, &[msg("a", None, json!(2))]).await;
    wait_delivered(&relay, 2).await;
    let calls = t.calls_for(ids[0]);
    assert_eq!(calls.len(), 2);
    let gap = calls[1].at - calls[0].at;
    assert!(gap >= Duration::from_millis(290), "retried after {gap:?}");

    let stats = relay.stats();
    assert_eq!(stats.latency_count, 2);
    assert!(stats.latency_p99_ms.is_some());
    relay.shutdown().await;
}
agentsaga_core::both_backends!(retries_then_delivered, retries_with_backoff_then_delivered);

async fn dead_letter_after_max_attempts(backend: Backend) {
    let store = store(backend).await;
    let t = Scripted::new();
    t.script("a", (1..=3).map(|i| Delivery::retry(format!("down {i}"))));
    let retry = RetryPolicy::new(Duration::from_millis(5), Duration::from_millis(20), 3);
    let relay = start(&store, &["a"], &t, config().retry(retry)).await;
    let ids = enqueue(&store, &[msg("a", Some("k"), json!("x"))]).await;
    wait_until("the row is dead", || async { relay.stats().dead == 1 }).await;

    assert_eq!(t.calls_for(ids[0]).len(), 3);
    let dead = store.admin().dead_letters(None, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].envelope.id, ids[0]);
    assert_eq!(dead[0].envelope.attempts, 3);
    assert_eq!(dead[0].last_error.as_deref(), Some("down 3"));
    let s = store.admin().stats().await.unwrap();
    assert_eq!((s.pending, s.in_flight, s.dead), (0, 0, 1));
    assert_eq!(relay.stats().retried, 2);
    relay.shutdown().await;
}
agentsaga_core::both_backends!(dead_after_max_attempts, dead_letter_after_max_attempts);

async fn reject_dead_letters_at_once(backend: Backend) {
    let store = store(backend).await;
    let t = Scripted::new();
    t.script("a", [Delivery::reject("undecodable payload")]);
    let relay = start(&store, &["a"], &t, config()).await;
    let ids = enqueue(&store, &[msg("a", None, json!({"bad": true}))]).await;
    wait_until("the row is dead", || async { relay.stats().dead == 1 }).await;

    assert_eq!(t.calls_for(ids[0]).len(), 1);
    let dead = store.admin().dead_letters(Some("a"), 10).await.unwrap();
    assert_eq!(dead[0].last_error.as_deref(), Some("undecodable payload"));
    assert_eq!(dead[0].envelope.attempts, 1);
    assert_eq!(relay.stats().retried, 0);
    relay.shutdown().await;
}
agentsaga_core::both_backends!(reject_dead_at_once, reject_dead_letters_at_once);

async fn reply_to_gets_a_delivery_failed_notice(backend: Backend) {
    let store = store(backend).await;
    let t = Scripted::new();
    t.script("agent", [Delivery::reject("no such step")]);
    let relay = start(&store, &["agent"], &t, config()).await;
    let m = msg("agent", Some("saga-1/step-0"), json!({"do": "it"}))
        .header(header::REPLY_TO, "orchestrator")
        .header(header::SAGA_ID, "saga-1")
        .header("step", "0");
    let ids = enqueue(&store, &[m]).await;
    wait_until("the row is dead", || async { relay.stats().dead == 1 }).await;

    // The notice waits for the orchestrator, which this relay does not serve.
    assert_eq!(store.admin().stats().await.unwrap().pending, 1);
    let destinations = vec!["orchestrator".to_owned()];
    let notices = store
        .queue()
        .claim(&Claim {
            owner: "test",
            destinations: &destinations,
            limit: 10,
            lease: Duration::from_secs(10),
        })
        .await
        .unwrap();
    assert_eq!(notices.len(), 1);
    let n = &notices[0];
    assert_eq!(n.header(header::SAGA_ID), Some("saga-1"));
    assert_eq!(n.header("step"), Some("0"));
    assert_eq!(n.header(header::KIND), Some(header::KIND_DELIVERY_FAILED));
    assert_eq!(
        n.header(header::CAUSATION_ID),
        Some(ids[0].to_string().as_str())
    );
    assert_eq!(n.header(header::REPLY_TO), None);
    let body: DeliveryFailed = n.decode().unwrap();
    assert_eq!(body.message_id, ids[0]);
    assert_eq!(body.destination, "agent");
    assert_eq!(body.reason, "no such step");
    relay.shutdown().await;
}
agentsaga_core::both_backends!(reply_to_notice, reply_to_gets_a_delivery_failed_notice);

async fn spent_rows_are_dead_without_delivery(backend: Backend) {
    let store = store(backend).await;
    let ids = enqueue(&store, &[msg("a", Some("k"), json!("crashes relays"))]).await;
    // Two relays "died" delivering it: claimed twice, leases expired.
    let destinations = vec!["a".to_owned()];
    for _ in 0..2 {
        let claim = Claim {
            owner: "crashing-relay",
            destinations: &destinations,
            limit: 1,
            lease: Duration::from_millis(1),
        };
        assert_eq!(store.queue().claim(&claim).await.unwrap().len(), 1);
        wait_until("the lease expires", || async {
            store.queue().reclaim_expired().await.unwrap() == 1
        })
        .await;
    }
    let t = Scripted::new();
    let retry = RetryPolicy::new(Duration::from_millis(5), Duration::from_millis(20), 2);
    let relay = start(&store, &["a"], &t, config().retry(retry)).await;
    wait_until("the row is dead", || async { relay.stats().dead == 1 }).await;
    assert!(t.calls_for(ids[0]).is_empty(), "not delivered again");
    let dead = store.admin().dead_letters(None, 10).await.unwrap();
    assert_eq!(dead[0].last_error.as_deref(), Some("attempts exhausted"));
    relay.shutdown().await;
}
agentsaga_core::both_backends!(attempts_exhausted, spent_rows_are_dead_without_delivery);
