//! Graceful shutdown, and a relay whose database goes away.

use std::time::Duration;

use agentsaga_core::queue::Claim;
use agentsaga_core::testing::Backend;
use serde_json::json;

use crate::support::{Scripted, config, enqueue, msg, start, store, wait_delivered, wait_until};

async fn shutdown_releases_unfinished_rows(backend: Backend) {
    let store = store(backend).await;
    let t = Scripted::new();
    t.block_destination("stuck");
    let cfg = config().shutdown_timeout(Duration::from_millis(300));
    let relay = start(&store, &["stuck", "ok"], &t, cfg).await;
    let mut batch: Vec<_> = (0..3)
        .map(|i| msg("stuck", Some(&format!("s{i}")), json!(i)))
        .collect();
    batch.extend((0..5).map(|i| msg("ok", None, json!(i))));
    enqueue(&store, &batch).await;
    wait_delivered(&relay, 5).await;
    wait_until("the stuck deliveries started", || async {
        t.calls_to("stuck").len() == 3
    })
    .await;
    assert_eq!(relay.stats().in_flight, 3);

    let started = tokio::time::Instant::now();
    let handle_stats = {
        let s = relay.stats();
        relay.shutdown().await;
        s
    };
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300), "waited {took:?}");
    assert!(took < Duration::from_secs(5), "waited {took:?}");
    assert_eq!(handle_stats.delivered, 5);

    let s = store.admin().stats().await.unwrap();
    assert_eq!((s.pending, s.in_flight, s.delivered), (3, 0, 5));
    // Released, not retried: the interrupted attempt is not counted.
    let destinations = vec!["stuck".to_owned()];
    let rows = store
        .queue()
        .claim(&Claim {
            owner: "next-relay",
            destinations: &destinations,
            limit: 10,
            lease: Duration::from_secs(10),
        })
        .await
        .unwrap();
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|e| e.attempts == 1), "{rows:?}");
}
agentsaga_core::both_backends!(releases_unfinished, shutdown_releases_unfinished_rows);

async fn shutdown_waits_for_deliveries_in_flight(backend: Backend) {
    let store = store(backend).await;
    let t = Scripted::new();
    t.delay("a", Duration::from_millis(300));
    let relay = start(&store, &["a"], &t, config()).await;
    let batch: Vec<_> = (0..4)
        .map(|i| msg("a", Some(&format!("k{i}")), json!(i)))
        .collect();
    enqueue(&store, &batch).await;
    wait_until("all four are in flight", || async { t.calls().len() == 4 }).await;
    relay.shutdown().await;
    let s = store.admin().stats().await.unwrap();
    assert_eq!((s.pending, s.in_flight, s.delivered), (0, 0, 4));
}
agentsaga_core::both_backends!(waits_for_in_flight, shutdown_waits_for_deliveries_in_flight);

async fn a_lost_database_is_survived(backend: Backend) {
    let store = store(backend).await;
    let t = Scripted::new();
    let relay = start(&store, &["a"], &t, config()).await;
    enqueue(&store, &[msg("a", None, json!(1))]).await;
    wait_delivered(&relay, 1).await;
    // Every database call fails from now on.
    store.close().await;
    wait_until("the relay has met errors", || async {
        relay.stats().db_errors >= 3
    })
    .await;
    let started = tokio::time::Instant::now();
    relay.shutdown().await;
    assert!(started.elapsed() < Duration::from_secs(5));
}
agentsaga_core::both_backends!(lost_database, a_lost_database_is_survived);
