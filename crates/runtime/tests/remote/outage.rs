//! The broker away for far longer than every retry policy while sagas cross it: the
//! commands, replies and compensations wait in their outboxes, spending no attempts
//! and shown as waiting for the broker; when it is back every saga ends as it would
//! have, each effect once, and nothing was dead-lettered.

use std::time::Instant;

use agentsaga_core::RetryPolicy;
use agentsaga_relay::RelayConfig;

use super::*;

/// Three attempts, 10–50 ms apart, and a breaker that probes soon: the policy is spent
/// within a second of failures.
fn short_policy() -> RelayConfig {
    RelayConfig::default()
        .retry(RetryPolicy::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
            3,
        ))
        .breaker_cooldown(Duration::from_millis(50))
}

async fn service(url: &str, server: &NatsServer, name: &str) -> Runtime {
    let link = link(server, name)
        .await
        .publish_timeout(Duration::from_millis(300));
    let builder = Runtime::builder()
        .database(url)
        .relay_config(short_policy());
    let rt = if name == "shop" {
        builder
            .agent(Recorder("stock"))
            .agent(Recorder("ship"))
            .saga(saga())
            .remote("payments", &link)
    } else {
        builder
            .agent(Recorder("payments"))
            .remote_saga("order", 1, &link)
    }
    .start()
    .await
    .unwrap();
    effects_table(rt.store()).await;
    rt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_away_longer_than_every_retry_policy_fails_no_saga() {
    let mut server = NatsServer::start();
    let (url_shop, url_pay) = (
        fresh_url(Backend::Sqlite).await,
        fresh_url(Backend::Sqlite).await,
    );
    let pay = service(&url_pay, &server, "payments").await;
    let shop = service(&url_shop, &server, "shop").await;
    server.stop();
    let ids = start_orders(&shop, 0..8).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    // Until the first publish failed (a row waits for the broker, or died).
    loop {
        let stats = shop.store().admin().stats().await.unwrap();
        if stats.unavailable + stats.dead > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no publish failed: {stats:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Away for two seconds: forty times the retry policy's whole course.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for rt in [&shop, &pay] {
        let stats = rt.store().admin().stats().await.unwrap();
        assert_eq!(stats.dead, 0, "dead-lettered while the broker was away");
    }
    let stats = shop.store().admin().stats().await.unwrap();
    assert!(stats.unavailable > 0, "{stats:?}");
    server.resume();
    let states = settle(&shop, &ids).await;
    check(&shop, &pay, &ids, &states).await;
    shop.shutdown().await;
    pay.shutdown().await;
}
