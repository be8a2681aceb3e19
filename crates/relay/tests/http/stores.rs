//! Two stores over HTTP: exactly once, a receiver down for a while, redelivery stored once.

use super::*;

async fn two_stores_exactly_once(backend: Backend) {
    let (a, b) = (store(backend).await, store(backend).await);
    let server = Server::bind(http::router(b.clone(), ReceiverConfig::new(TOKEN)).unwrap()).await;
    // B's own relay delivers what it receives to its local destination.
    let local = Collect::default();
    let relay_b = start_relay(&b, &["remote"], local.clone()).await;
    let transport = HttpTransport::new(TOKEN)
        .route("remote", server.url(OUTBOX_PATH))
        .timeout(Duration::from_secs(5));
    let relay_a = start_relay(&a, &["remote"], transport).await;

    let sent = enqueue_fifty(&a).await;
    wait_delivered(&relay_a, 50).await;
    wait_delivered(&relay_b, 50).await;

    let sa = a.admin().stats().await.unwrap();
    assert_eq!(
        (sa.delivered, sa.pending, sa.in_flight, sa.dead),
        (50, 0, 0, 0)
    );
    assert_received_once(&b, &sent).await;
    assert_eq!(b.admin().stats().await.unwrap().delivered, 50);

    // What reached B's destination is what A sent: once each, payload and headers kept.
    let got = local.envelopes();
    assert_eq!(got.len(), 50, "B's relay delivered some twice");
    for m in &sent {
        let e = got.iter().find(|e| e.id == m.id).expect("arrived");
        assert_eq!(e.destination, "remote");
        assert_eq!(e.key.as_deref(), m.key.as_deref());
        let payload: serde_json::Value = serde_json::from_str(&e.payload).unwrap();
        let sent_payload: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
        assert_eq!(payload, sent_payload);
        assert_eq!(e.header("n"), m.headers.get("n").map(String::as_str));
    }
    relay_a.shutdown().await;
    relay_b.shutdown().await;
    server.stop().await;
}
agentsaga_core::both_backends!(two_stores, two_stores_exactly_once);

async fn receiver_down_for_a_while(backend: Backend) {
    let (a, b) = (store(backend).await, store(backend).await);
    // A port with nobody listening: connections are refused until B starts.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let transport = HttpTransport::new(TOKEN)
        .route("remote", format!("http://{addr}{OUTBOX_PATH}"))
        .timeout(Duration::from_secs(5));
    // Three attempts, and no breaker to slow the failures: a receiver away for longer
    // than the policy spends nothing and kills nothing.
    let config = relay_config(RetryPolicy::new(
        Duration::from_millis(20),
        Duration::from_millis(50),
        3,
    ))
    .breaker_threshold(0);
    let relay_a = start_relay_with(&a, &["remote"], transport, config).await;

    let sent = enqueue_fifty(&a).await;
    wait_until("every row failed four times over", || async {
        relay_a.stats().retried >= 200
    })
    .await;
    let sa = a.admin().stats().await.unwrap();
    assert_eq!((sa.delivered, sa.dead), (0, 0), "{sa:?}");
    assert_eq!(sa.pending + sa.in_flight, 50, "{sa:?}");
    assert!(sa.unavailable > 0, "shown as waiting for it: {sa:?}");
    let waiting = a.admin().waiting_by_destination().await.unwrap();
    assert!(
        waiting[0]
            .unavailable_reason
            .as_deref()
            .is_some_and(|r| r.starts_with("unavailable: cannot connect")),
        "{waiting:?}"
    );
    assert!(rows(&b, "remote").await.is_empty());

    // B comes up on that port; everything arrives, once.
    let listener = TcpListener::bind(addr).await.expect("rebind the port");
    let server = Server::serve(
        listener,
        http::router(b.clone(), ReceiverConfig::new(TOKEN)).unwrap(),
    );
    wait_delivered(&relay_a, 50).await;
    let sa = a.admin().stats().await.unwrap();
    assert_eq!((sa.delivered, sa.dead), (50, 0), "{sa:?}");
    assert_received_once(&b, &sent).await;
    assert_eq!(b.admin().stats().await.unwrap().pending, 50);
    relay_a.shutdown().await;
    server.stop().await;
}
agentsaga_core::both_backends!(receiver_down, receiver_down_for_a_while);

async fn redelivery_is_stored_once(backend: Backend) {
    let b = store(backend).await;
    let server = Server::bind(http::router(b.clone(), ReceiverConfig::new(TOKEN)).unwrap()).await;
    let mut env = envelope("remote", r#"{"charge":42}"#);
    assert_eq!(
        post_envelope(&server, &env).await,
        (StatusCode::NO_CONTENT, String::new())
    );
    assert_eq!(post_envelope(&server, &env).await.0, StatusCode::NO_CONTENT);
    // The sender's relay retrying after a lost answer: a later attempt, same id.
    env.attempts = 2;
    assert_eq!(post_envelope(&server, &env).await.0, StatusCode::NO_CONTENT);

    assert_eq!(
        rows(&b, "remote").await,
        [(env.id, Some("order-1".to_owned()))]
    );
    assert_eq!(b.admin().stats().await.unwrap().pending, 1);
    server.stop().await;
}
agentsaga_core::both_backends!(redelivery, redelivery_is_stored_once);
