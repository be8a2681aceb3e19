//! Per-key order from A's outbox to B's: across a receiver restart mid-stream, a store
//! that refuses (its outbox full: the batch handed back), and a restart of the server.

use super::*;

/// The ids of `rows` of key `key`, in B's order.
fn ids_of(rows: &[Row], key: &str) -> Vec<MessageId> {
    rows.iter()
        .filter(|r| r.key.as_deref() == Some(key))
        .map(|r| r.id)
        .collect()
}

fn sent_ids(sent: &[Message]) -> Vec<MessageId> {
    sent.iter().map(|m| m.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_arrives_in_order_across_a_receiver_restart() {
    let server = Server::start();
    let (a, b) = (store().await, store().await);
    let relay = start_relay(&a, with_stream(&server).await).await;
    let sent = enqueue(&a, 40, Some("order-1")).await;
    wait_until("A's rows published", DEADLINE, async || {
        a.admin().stats().await.unwrap().delivered == 40
    })
    .await;

    let receiver = start_receiver(&server, &b).await;
    wait_until("some stored", DEADLINE, async || {
        outbox(&b).await.len() >= 8
    })
    .await;
    stop(receiver).await;
    let before = outbox(&b).await.len();
    let receiver = start_receiver(&server, &b).await;
    let rows = wait_rows(&b, 40).await;
    assert_eq!(
        ids_of(&rows, "order-1"),
        sent_ids(&sent),
        "stopped after {before}"
    );
    assert_eq!(rows.len(), 40);
    relay.shutdown().await;
    stop(receiver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_outbox_hands_the_batch_back_and_order_holds() {
    let server = Server::start();
    let a = store().await;
    // B's outbox takes 3 pending rows; its relay is not running yet.
    let b = store_with(StoreConfig::default().max_pending(Some(3))).await;
    let relay_a = start_relay(&a, with_stream(&server).await).await;
    let sent = enqueue(&a, 12, Some("order-1")).await;
    let receiver = start_receiver(&server, &b).await;
    wait_until("the store refused a batch", DEADLINE, async || {
        receiver.stats().naks > 0
    })
    .await;
    assert!(outbox(&b).await.len() <= 3);

    // B's relay drains its outbox (to a local destination that records the order),
    // making room: the receiver goes on.
    let local = Collect::default();
    let relay_b = Relay::start(
        b.clone(),
        vec![DEST.to_owned()],
        Arc::new(local.clone()),
        RelayConfig::default(),
    )
    .await
    .unwrap();
    wait_until("all delivered in B", DEADLINE, async || {
        local.ids().len() >= 12
    })
    .await;
    assert_eq!(
        local.ids(),
        sent_ids(&sent),
        "B's agent got them in A's order"
    );
    assert_eq!(ids_of(&outbox(&b).await, "order-1"), sent_ids(&sent));
    relay_a.shutdown().await;
    relay_b.shutdown().await;
    stop(receiver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_loses_nothing_and_keeps_order() {
    let mut server = Server::start();
    let (a, b) = (store().await, store().await);
    let relay = start_relay(&a, with_stream(&server).await).await;
    let receiver = start_receiver(&server, &b).await;
    let mut sent = enqueue(&a, 10, Some("order-1")).await;
    wait_rows(&b, 10).await;

    server.restart();
    sent.extend(enqueue(&a, 10, Some("order-1")).await);
    // The relay publishes once the server is back; the receiver goes on by itself.
    let rows = wait_rows(&b, 20).await;
    assert_eq!(ids_of(&rows, "order-1"), sent_ids(&sent));
    assert_eq!(rows.len(), 20);
    wait_until("all acknowledged", DEADLINE, async || {
        let info = consumer_info(&server).await;
        info.num_ack_pending == 0 && info.num_pending == 0
    })
    .await;
    relay.shutdown().await;
    stop(receiver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_left_unacknowledged_comes_back_before_later_ones_of_its_key() {
    let server = Server::start();
    let b = store().await;
    let _stream = with_stream(&server).await;
    let (first, second) = one_left_unacknowledged(&server, Duration::from_secs(2)).await;

    let receiver = start_receiver(&server, &b).await;
    let rows = wait_rows(&b, 2).await;
    assert_eq!(ids_of(&rows, "order-7"), [first.id, second.id]);
    stop(receiver).await;
}

// The consumer exists with a longer ack_wait than the receiver now configured (its
// predecessor's): the receiver waits for the server's own, not its configuration's,
// before it fetches, and the consumer takes the new ack_wait from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_made_with_a_longer_ack_wait_is_waited_for_then_updated() {
    let server = Server::start();
    let b = store().await;
    let _stream = with_stream(&server).await;
    let (first, second) = one_left_unacknowledged(&server, Duration::from_secs(6)).await;

    // This receiver's ack_wait is 2 s.
    let receiver = start_receiver(&server, &b).await;
    let rows = wait_rows(&b, 2).await;
    assert_eq!(ids_of(&rows, "order-7"), [first.id, second.id]);
    assert_eq!(
        consumer_info(&server).await.config.ack_wait,
        Duration::from_secs(2)
    );
    stop(receiver).await;
}

/// Two messages of one key to [`DEST`]: a receiver (its consumer made with
/// `ack_wait`) took the first and died before acknowledging it; then the second came.
async fn one_left_unacknowledged(server: &Server, ack_wait: Duration) -> (Envelope, Envelope) {
    let subject = format!("agentsaga.{DEST}");
    let (first, second) = (envelope(DEST), envelope(DEST));
    publish_raw(server, &subject, serde_json::to_vec(&first).unwrap(), &[]).await;
    take_without_ack_within(server, 1, ack_wait).await;
    publish_raw(server, &subject, serde_json::to_vec(&second).unwrap(), &[]).await;
    (first, second)
}

/// A local destination that records what it is handed, in order.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<MessageId>>>);

impl Collect {
    fn ids(&self) -> Vec<MessageId> {
        self.0.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl Transport for Collect {
    async fn deliver(&self, envelope: &Envelope) -> Delivery {
        self.0.lock().unwrap().push(envelope.id);
        Delivery::Delivered
    }
}
