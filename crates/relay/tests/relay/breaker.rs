//! The circuit breaker: a failing destination is paused, the others keep flowing.

use std::time::Duration;

use agentsaga_core::RetryPolicy;
use agentsaga_core::testing::Backend;
use agentsaga_relay::Delivery;
use serde_json::json;

use crate::support::{Scripted, config, enqueue, msg, start, store, wait_delivered, wait_until};

async fn breaker_opens_pauses_and_closes(backend: Backend) {
    let cooldown = Duration::from_millis(1200);
    let store = store(backend).await;
    let t = Scripted::new();
    t.default_for("bad", Delivery::retry("bad is down"));
    let retry = RetryPolicy::new(Duration::from_millis(5), Duration::from_millis(20), 100);
    let cfg = config()
        .retry(retry)
        .breaker_threshold(3)
        .breaker_cooldown(cooldown);
    let relay = start(&store, &["bad", "good"], &t, cfg).await;

    enqueue(&store, &[msg("bad", Some("b"), json!(0))]).await;
    wait_until("three failures", || async { t.calls_to("bad").len() >= 3 }).await;
    let third = t.calls_to("bad")[2].at;

    // While "bad" cools down, "good" flows.
    let good: Vec<_> = (0..20).map(|i| msg("good", None, json!(i))).collect();
    enqueue(&store, &good).await;
    wait_delivered(&relay, 20).await;
    let last_good = t.calls_to("good").iter().map(|c| c.at).max().unwrap();
    assert!(
        last_good < third + cooldown,
        "good traffic waited for the cooldown"
    );

    // After the cooldown one probe goes through; it fails and the breaker reopens.
    wait_until("the probe", || async { t.calls_to("bad").len() >= 4 }).await;
    let probe = t.calls_to("bad")[3].at;
    assert!(
        probe - third >= cooldown,
        "probed after {:?}",
        probe - third
    );
    wait_until("the failed probe reopened the breaker", || async {
        relay.stats().breaker_trips == 2
    })
    .await;

    t.default_for("bad", Delivery::Delivered);
    wait_delivered(&relay, 21).await;
    let calls = t.calls_to("bad");
    assert_eq!(calls.len(), 5, "one more probe, which succeeded");
    assert!(
        calls[4].at - probe >= cooldown,
        "reopened for a full cooldown"
    );
    assert_eq!(relay.stats().breaker_trips, 2);

    // Closed again: "bad" traffic flows without pauses.
    let before = tokio::time::Instant::now();
    let more: Vec<_> = (0..5).map(|i| msg("bad", None, json!(i))).collect();
    enqueue(&store, &more).await;
    wait_delivered(&relay, 26).await;
    assert!(before.elapsed() < cooldown, "took {:?}", before.elapsed());
    relay.shutdown().await;
}
agentsaga_core::both_backends!(opens_pauses_closes, breaker_opens_pauses_and_closes);
