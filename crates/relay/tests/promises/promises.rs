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
