//! The promises, each a function of the crossing and the backend.

use super::*;

/// Per-key order and once-only delivery over a slow link (256 KiB/s each way).
pub(crate) async fn order_over_a_throttled_link<C: Crossing>(backend: Backend) {
    let (a, b) = (store(backend).await, store(backend).await);
    let c = C::start(&a, &b, relay_config(10)).await;
    c.link().throttle(256 * 1024);
    let sent = enqueue(&a, 0, 40, 3, 6 * 1024).await;
    arrived_once_in_order(&a, &b, &sent).await;
    c.stop().await;
}

/// The same when the link is cut in the middle (every connection closed, new ones
/// closed at once) for a second and restored.
pub(crate) async fn order_when_the_link_is_cut_and_restored<C: Crossing>(backend: Backend) {
    let (a, b) = (store(backend).await, store(backend).await);
    let c = C::start(&a, &b, relay_config(20)).await;
    let mut sent = enqueue(&a, 0, 60, 3, 512).await;
    wait_until("some arrived", DEADLINE, async || {
        rows(&b).await.len() >= 10
    })
    .await;
    c.link().cut();
    sent.extend(enqueue(&a, 60, 20, 3, 512).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.link().restore();
    arrived_once_in_order(&a, &b, &sent).await;
    c.stop().await;
}

/// The other side away for far longer than A's retry policy (3 attempts, 10–100 ms):
/// the rows wait in A's outbox spending nothing, shown as waiting for it; nothing is
/// dead-lettered; when it is back everything arrives once, in order.
pub(crate) async fn an_outage_longer_than_the_retry_policy_fails_nothing<C: Crossing>(
    backend: Backend,
) {
    let (a, b) = (store(backend).await, store(backend).await);
    let mut c = C::start(&a, &b, relay_config(3)).await;
    c.away().await;
    let sent = enqueue(&a, 0, 20, 2, 64).await;
    wait_until(
        "three times the policy's attempts failed",
        DEADLINE,
        async || c.relay().stats().retried >= 9,
    )
    .await;
    let stats = a.admin().stats().await.unwrap();
    assert_eq!(stats.dead, 0, "dead-lettered while the other side was away");
    assert!(
        stats.unavailable > 0,
        "not shown as waiting for it: {stats:?}"
    );
    c.back().await;
    arrived_once_in_order(&a, &b, &sent).await;
    assert_eq!(a.admin().stats().await.unwrap().unavailable, 0);
    c.stop().await;
}

/// A message to a destination the transport cannot carry is dead-lettered at once with
/// its reason, its `reply_to` told (`DeliveryFailed`), and the key's next message goes
/// on; the others arrive once, in order.
pub(crate) async fn what_cannot_be_carried_is_dead_lettered_with_its_reason<C: Crossing>(
    backend: Backend,
) {
    let (a, b) = (store(backend).await, store(backend).await);
    let c = C::start(&a, &b, relay_config(10)).await;
    let bad = Message::to(BAD).key("k0").header("reply_to", "orch");
    let mut tx = a.begin().await.unwrap();
    tx.enqueue(&bad).await.unwrap();
    tx.commit().await.unwrap();
    let sent = enqueue(&a, 0, 10, 2, 64).await;
    wait_until("B has the carried ones", DEADLINE, async || {
        rows(&b).await.len() >= sent.len()
    })
    .await;
    let dead = a.admin().dead_letters(Some(BAD), 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(
        dead[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains(BAD)),
        "the reason names the destination: {dead:?}"
    );
    let notices = a.admin().waiting_by_destination().await.unwrap();
    assert!(
        notices
            .iter()
            .any(|r| r.destination == "orch" && r.pending == 1),
        "no DeliveryFailed to the reply_to: {notices:?}"
    );
    let got = rows(&b).await;
    assert_eq!(got.len(), sent.len());
    let ids: Vec<MessageId> = got.into_iter().map(|(id, _)| id).collect();
    let k0: Vec<MessageId> = sent
        .iter()
        .filter(|m| m.key.as_deref() == Some("k0"))
        .map(|m| m.id)
        .collect();
    let k0_got: Vec<MessageId> = ids.into_iter().filter(|id| k0.contains(id)).collect();
    assert_eq!(k0_got, k0);
    c.stop().await;
}

/// The link frozen mid-stream (connections open, nothing through, as a peer under
/// `SIGSTOP` looks) past the receiver's ack wait and the sender's timeout, then thawed:
/// what was held arrives late, as a repeat, and is stored once; order holds.
pub(crate) async fn a_frozen_link_past_the_ack_wait_loses_nothing<C: Crossing>(backend: Backend) {
    let (a, b) = (store(backend).await, store(backend).await);
    let c = C::start(&a, &b, relay_config(30)).await;
    let mut sent = enqueue(&a, 0, 40, 3, 512).await;
    wait_until("some arrived", DEADLINE, async || rows(&b).await.len() >= 8).await;
    c.link().freeze();
    sent.extend(enqueue(&a, 40, 20, 3, 512).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.link().thaw();
    arrived_once_in_order(&a, &b, &sent).await;
    c.stop().await;
}

/// The receiving side dies mid-stream (a batch or a request committed and not
/// answered, maybe) and starts again: everything arrives once, in order.
pub(crate) async fn a_receiver_crash_mid_stream_loses_nothing<C: Crossing>(backend: Backend) {
    let (a, b) = (store(backend).await, store(backend).await);
    let mut c = C::start(&a, &b, relay_config(30)).await;
    c.link().throttle(64 * 1024);
    let sent = enqueue(&a, 0, 60, 3, 1024).await;
    wait_until("some arrived", DEADLINE, async || {
        rows(&b).await.len() >= 10
    })
    .await;
    c.crash_receiver().await;
    c.link().throttle(0);
    arrived_once_in_order(&a, &b, &sent).await;
    c.stop().await;
}

/// A message larger than the receiving store takes is dead-lettered (on whichever side
/// learns it) with its reason, and its `reply_to` is told (`DeliveryFailed`); the key's
/// next messages arrive, in order.
pub(crate) async fn what_the_receiver_cannot_store_is_dead_lettered_and_told<C: Crossing>(
    backend: Backend,
) {
    let a = store(backend).await;
    let b = store_with(
        backend,
        agentsaga_core::StoreConfig::default().max_message_bytes(16 * 1024),
    )
    .await;
    let c = C::start(&a, &b, relay_config(10)).await;
    let big = Message::to(DEST)
        .key("k0")
        .header("reply_to", "orch")
        .json(&serde_json::json!({ "pad": "x".repeat(32 * 1024) }))
        .unwrap();
    let mut tx = a.begin().await.unwrap();
    tx.enqueue(&big).await.unwrap();
    tx.commit().await.unwrap();
    let sent = enqueue(&a, 0, 5, 1, 64).await;
    wait_until("the key's next ones arrived", DEADLINE, async || {
        rows(&b).await.len() >= sent.len()
    })
    .await;
    let mut dead = a.admin().dead_letters(Some(DEST), 10).await.unwrap();
    dead.extend(b.admin().dead_letters(Some(DEST), 10).await.unwrap());
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].envelope.id, big.id);
    assert!(
        dead[0].last_error.as_deref().is_some_and(|e| !e.is_empty()),
        "{dead:?}"
    );
    let mut told = 0;
    for side in [&a, &b] {
        let waiting = side.admin().waiting_by_destination().await.unwrap();
        told += waiting
            .iter()
            .filter(|r| r.destination == "orch")
            .map(|r| r.pending)
            .sum::<u64>();
    }
    assert_eq!(told, 1, "one DeliveryFailed to the reply_to");
    let ids: Vec<MessageId> = rows(&b).await.into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, sent.iter().map(|m| m.id).collect::<Vec<_>>());
    c.stop().await;
}
