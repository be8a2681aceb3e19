//! A broker away for longer than every retry policy: the rows wait in the outbox,
//! spending no attempts and dead-lettering nothing, shown as waiting for it; when it is
//! back, everything goes out once, in order.

use agentsaga_core::RetryPolicy;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_away_longer_than_the_retry_policy_spends_nothing() {
    let mut server = Server::start();
    let (a, b) = (store().await, store().await);
    let nats = with_stream(&server)
        .await
        .timeout(Duration::from_millis(300));
    // Three attempts: the old relay dead-lettered the head of the key within a second.
    let config = RelayConfig::default()
        .retry(RetryPolicy::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
            3,
        ))
        .breaker_threshold(5)
        .breaker_cooldown(Duration::from_millis(50));
    let relay = Relay::start(a.clone(), vec![DEST.to_owned()], Arc::new(nats), config)
        .await
        .expect("start the relay");

    server.stop();
    let sent = enqueue(&a, 6, Some("order-1")).await;
    wait_until(
        "three times the policy's attempts failed",
        DEADLINE,
        async || relay.stats().retried >= 9,
    )
    .await;
    let s = a.admin().stats().await.unwrap();
    assert_eq!(
        (s.dead, s.delivered),
        (0, 0),
        "dead-lettered while the broker was away: {:?}",
        outbox(&a).await
    );
    assert!(
        s.unavailable >= 1,
        "not shown as waiting for the broker: {s:?}"
    );
    let stats = relay.stats();
    assert!(stats.breaker_trips >= 1 && stats.paused == 1, "{stats:?}");
    let rows = outbox(&a).await;
    assert!(
        rows[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("unavailable: NATS publish")),
        "{rows:?}"
    );

    // Back: the stream takes everything, in order, once; B stores it so.
    server.resume();
    wait_until("everything published", DEADLINE, async || {
        a.admin().stats().await.unwrap().delivered == 6
    })
    .await;
    let s = a.admin().stats().await.unwrap();
    assert_eq!((s.dead, s.unavailable), (0, 0), "{s:?}");
    assert_eq!(relay.stats().paused, 0);
    let receiver = start_receiver(&server, &b).await;
    let rows = wait_rows(&b, 6).await;
    assert_eq!(
        rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        sent.iter().map(|m| m.id).collect::<Vec<_>>()
    );
    relay.shutdown().await;
    stop(receiver).await;
}
