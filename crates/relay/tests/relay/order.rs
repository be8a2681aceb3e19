//! Per-key order under parallel workers, and key isolation.

use std::collections::BTreeMap;
use std::time::Duration;

use agentsaga_core::testing::Backend;
use agentsaga_core::{RetryPolicy, Store};
use agentsaga_relay::Delivery;
use serde_json::json;

use crate::support::{Scripted, config, enqueue, msg, start, store, wait_delivered};

async fn per_key_order_with_eight_workers(backend: Backend) {
    const KEYS: usize = 50;
    const PER_KEY: u64 = 10;
    let store = store(backend).await;
    let t = Scripted::new();
    t.jitter(2);
    t.flaky("a", 0.1);
    let retry = RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(5), 1000);
    // The breaker would only pause "a" now and then; order is what is tested here.
    let cfg = config().workers(8).retry(retry).breaker_threshold(0);
    let relay = start(&store, &["a"], &t, cfg).await;

    // Interleaved keys, several transactions.
    for i in 0..PER_KEY {
        let batch: Vec<_> = (0..KEYS)
            .map(|k| msg("a", Some(&format!("key-{k}")), json!({"k": k, "i": i})))
            .collect();
        enqueue(&store, &batch).await;
    }
    wait_delivered(&relay, KEYS as u64 * PER_KEY).await;

    let mut seen: BTreeMap<String, Vec<(u64, bool)>> = BTreeMap::new();
    for call in t.calls() {
        let i = call.envelope.decode::<serde_json::Value>().unwrap()["i"]
            .as_u64()
            .unwrap();
        let delivered = call.reply == Delivery::Delivered;
        seen.entry(call.envelope.key.clone().unwrap())
            .or_default()
            .push((i, delivered));
    }
    assert_eq!(seen.len(), KEYS);
    for (key, calls) in &seen {
        let attempts: Vec<u64> = calls.iter().map(|(i, _)| *i).collect();
        assert!(
            attempts.windows(2).all(|w| w[0] <= w[1]),
            "{key}: attempts out of order: {attempts:?}"
        );
        let delivered: Vec<u64> = calls.iter().filter(|c| c.1).map(|c| c.0).collect();
        assert_eq!(delivered, (0..PER_KEY).collect::<Vec<_>>(), "{key}");
    }
    assert!(
        relay.stats().retried > 0,
        "the flaky transport forced retries"
    );
    relay.shutdown().await;
}
agentsaga_core::both_backends!(per_key_order, per_key_order_with_eight_workers);

async fn a_failing_key_does_not_slow_the_others(backend: Backend) {
    let store = store(backend).await;
    let t = Scripted::new();
    // "poison" fails forever; "slow" hangs until the gate opens.
    t.script_key(
        "poison",
        (0..10_000).map(|_| Delivery::retry_after("poisoned", Duration::from_millis(5))),
    );
    t.block_key("slow");
    let retry = RetryPolicy::new(Duration::from_millis(5), Duration::from_millis(20), 10_000);
    // Destination-wide pauses are the breaker's test; here only keys are isolated.
    let cfg = config().workers(4).retry(retry).breaker_threshold(0);
    let relay = start(&store, &["a"], &t, cfg).await;

    let mut first = vec![
        msg("a", Some("poison"), json!(0)),
        msg("a", Some("poison"), json!(1)),
        msg("a", Some("slow"), json!(0)),
        msg("a", Some("slow"), json!(1)),
    ];
    first.extend((0..100).map(|i| msg("a", Some(&format!("k{}", i % 20)), json!(i))));
    first.extend((0..50).map(|i| msg("a", None, json!(i))));
    enqueue(&store, &first).await;

    // All 150 others arrive while "slow" is stuck and "poison" keeps failing.
    wait_delivered(&relay, 150).await;
    assert_eq!(
        t.calls()
            .iter()
            .filter(|c| c.envelope.key.as_deref() == Some("slow"))
            .count(),
        1
    );
    assert_eq!(
        undelivered(&store).await,
        4,
        "poison ×2 and slow ×2 are held back"
    );
    let poison_calls = t
        .calls()
        .iter()
        .filter(|c| c.envelope.key.as_deref() == Some("poison"))
        .count();
    assert!(poison_calls >= 1);

    t.open_gate();
    wait_delivered(&relay, 152).await;
    relay.shutdown().await;
}
agentsaga_core::both_backends!(failing_key_isolated, a_failing_key_does_not_slow_the_others);

async fn undelivered(store: &Store) -> u64 {
    let s = store.admin().stats().await.unwrap();
    s.pending + s.in_flight
}
