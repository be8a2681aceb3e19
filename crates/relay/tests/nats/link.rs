//! Per-key order over a slow or broken link between the broker and the receiver: a
//! proxy of the test's own ([`Proxy`]) throttles the receiver's link, or cuts it in the
//! middle of a batch and restores it. One key's messages are stored in the order they
//! were sent, each once.

use super::proxy::Proxy;
use super::*;

/// Messages of the backlog, and their size: a batch of 20 takes about 2 s over a link
/// of 200 KB/s, four times the receiver's fetch wait.
const BACKLOG: usize = 60;
const PAD: usize = 20_000;
const RATE: u64 = 200_000;

/// [`BACKLOG`] messages of one key, published by A's relay straight to the server
/// (not through the proxy).
async fn backlog(server: &Server) -> (Relay, Vec<Message>) {
    let a = store().await;
    let relay = start_relay(&a, with_stream(server).await).await;
    let pad = "x".repeat(PAD);
    let sent: Vec<Message> = (0..BACKLOG)
        .map(|i| {
            Message::to(DEST)
                .json(&serde_json::json!({ "n": i, "pad": pad }))
                .unwrap()
                .key("order-1")
        })
        .collect();
    let mut tx = a.begin().await.unwrap();
    tx.enqueue_batch(&sent).await.unwrap();
    tx.commit().await.unwrap();
    wait_until("A's rows published", DEADLINE, async || {
        a.admin().stats().await.unwrap().delivered == BACKLOG as u64
    })
    .await;
    (relay, sent)
}

/// B's receiver through `proxy`: batches of 20, an ack wait of 2 s.
async fn receiver_through(proxy: &Proxy, b: &Store) -> NatsReceiver {
    NatsReceiver::start(&proxy.url(), b.clone(), receiver_config().batch_size(20))
        .await
        .expect("start the receiver")
}

/// B's rows are A's messages, in A's order, each once.
async fn assert_in_order_once(server: &Server, b: &Store, sent: &[Message]) {
    let rows = wait_rows(b, sent.len()).await;
    let got: Vec<MessageId> = rows.iter().map(|r| r.id).collect();
    let want: Vec<MessageId> = sent.iter().map(|m| m.id).collect();
    let number = |id: &MessageId| want.iter().position(|w| w == id);
    assert_eq!(
        got,
        want,
        "stored order (by number sent): {:?}",
        got.iter().map(number).collect::<Vec<_>>()
    );
    assert!(rows.iter().all(|r| r.state == "pending"), "{rows:?}");
    wait_until("all acknowledged", DEADLINE, async || {
        let info = consumer_info(server).await;
        info.num_ack_pending == 0 && info.num_pending == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_stays_in_order_over_a_throttled_link() {
    let server = Server::start();
    let (relay, sent) = backlog(&server).await;
    let proxy = Proxy::to_url(&server.url()).await;
    proxy.throttle(RATE);
    let b = store().await;
    let receiver = receiver_through(&proxy, &b).await;
    assert_in_order_once(&server, &b, &sent).await;
    stop(receiver).await;
    relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_stays_in_order_when_the_link_is_cut_mid_batch_and_restored() {
    let server = Server::start();
    let (relay, sent) = backlog(&server).await;
    let proxy = Proxy::to_url(&server.url()).await;
    proxy.throttle(RATE);
    let b = store().await;
    let receiver = receiver_through(&proxy, &b).await;
    // The first batch stored, the second on its way (about 2 s long): cut it.
    wait_until("a first batch stored", DEADLINE, async || {
        !outbox(&b).await.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    proxy.cut();
    // The link stays down a while (the client tries to reconnect meanwhile).
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.restore();
    assert_in_order_once(&server, &b, &sent).await;
    let stats = receiver.stats();
    // The cut broke a fetch (the session started again, after waiting out ack_wait for
    // what the fetch held), or, between fetches, the acknowledgements of a batch.
    assert!(
        stats.reconnects + stats.ack_failures >= 1,
        "the cut hit the receiver: {stats:?}"
    );
    stop(receiver).await;
    relay.shutdown().await;
}
