//! NATS JetStream between two services against a real `nats-server -js` (feature
//! `nats`): a throwaway server per test ([`server::Server`]), and stores of their own
//! (SQLite files in temp dirs): the transport publishing, the receiver storing.

mod auth;
mod bad_input;
mod creds;
mod lag;
mod link;
mod order;
mod outage;
mod proxy;
mod receiver;
mod replicas;
mod server;
mod transport;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga_core::testing::{Backend, fresh_url, wait_until};
use agentsaga_core::{Envelope, Message, MessageId, Store, StoreConfig, sqlx};
use agentsaga_relay::nats::{NatsError, NatsReceiver, NatsReceiverConfig, NatsTransport};
use agentsaga_relay::{Delivery, Relay, RelayConfig, Transport};
use async_nats::jetstream;
use server::Server;

/// How long any condition may take before a test fails.
const DEADLINE: Duration = Duration::from_secs(30);

/// The destination the receiving service serves.
const DEST: &str = "payments";

fn envelope(destination: &str) -> Envelope {
    Envelope {
        seq: 7,
        id: MessageId::new(),
        destination: destination.to_owned(),
        key: Some("order-7".into()),
        payload: r#"{"amount":42}"#.into(),
        headers: [(
            "traceparent".to_owned(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
        )]
        .into_iter()
        .collect(),
        attempts: 1,
        created_at_ms: 1_700_000_000_000,
    }
}

/// The stream the tests publish to.
const STREAM: &str = "AGENTSAGA";

/// A transport to `server`, its stream made.
async fn with_stream(server: &Server) -> NatsTransport {
    let nats = NatsTransport::connect(&server.url()).await.unwrap();
    nats.ensure_stream(STREAM, Duration::from_secs(120))
        .await
        .unwrap();
    nats
}

/// A fresh SQLite store in a temp dir.
async fn store() -> Store {
    store_with(StoreConfig::default()).await
}

async fn store_with(config: StoreConfig) -> Store {
    Store::connect_with(&fresh_url(Backend::Sqlite).await, config)
        .await
        .expect("open the store")
}

/// The receiving service's configuration in the tests: [`DEST`], small batches, a
/// short ack wait and fetch wait.
fn receiver_config() -> NatsReceiverConfig {
    NatsReceiverConfig::new(STREAM, "svc-b")
        .destinations([DEST])
        .batch_size(4)
        .ack_wait(Duration::from_secs(2))
        .fetch_wait(Duration::from_millis(500))
}

async fn start_receiver(server: &Server, store: &Store) -> NatsReceiver {
    NatsReceiver::start(&server.url(), store.clone(), receiver_config())
        .await
        .expect("start the receiver")
}

/// Stops `receiver`, failing the test if it takes over [`DEADLINE`].
async fn stop(receiver: NatsReceiver) {
    tokio::time::timeout(DEADLINE, receiver.stop())
        .await
        .expect("the receiver stops");
}

/// A relay on `store` publishing [`DEST`] through `nats`.
async fn start_relay(store: &Store, nats: NatsTransport) -> Relay {
    Relay::start(
        store.clone(),
        vec![DEST.to_owned()],
        Arc::new(nats.timeout(Duration::from_secs(2))),
        RelayConfig::default(),
    )
    .await
    .expect("start the relay")
}

/// An outbox row, as the tests compare it.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    id: MessageId,
    destination: String,
    key: Option<String>,
    payload: serde_json::Value,
    headers: serde_json::Value,
    state: String,
    last_error: Option<String>,
}

/// Every outbox row of `store`, in its order (seq).
async fn outbox(store: &Store) -> Vec<Row> {
    type Raw = (
        String,
        String,
        Option<String>,
        String,
        String,
        String,
        Option<String>,
    );
    let Some(reader) = store.reader().sqlite() else {
        panic!("the tests' stores are SQLite's");
    };
    let rows: Vec<Raw> = sqlx::query_as(
        "SELECT id, destination, key, payload, headers, state, last_error FROM outbox \
         ORDER BY seq",
    )
    .fetch_all(reader)
    .await
    .expect("read the outbox");
    rows.into_iter()
        .map(
            |(id, destination, key, payload, headers, state, last_error)| Row {
                id: id.parse().expect("a uuid"),
                destination,
                key,
                payload: serde_json::from_str(&payload).expect("a JSON payload"),
                headers: serde_json::from_str(&headers).expect("JSON headers"),
                state,
                last_error,
            },
        )
        .collect()
}

/// Waits until `store`'s outbox holds `n` rows; returns them.
async fn wait_rows(store: &Store, n: usize) -> Vec<Row> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    wait_until(&format!("{n} outbox rows"), DEADLINE, async || {
        let rows = outbox(store).await;
        let enough = rows.len() >= n;
        *seen.lock().unwrap() = rows;
        enough
    })
    .await;
    seen.lock().unwrap().clone()
}

/// Enqueues `n` messages to [`DEST`] in `store`, all of key `key` (or every other one
/// keyed, with `None`), each with its number as payload and a header.
async fn enqueue(store: &Store, n: usize, key: Option<&str>) -> Vec<Message> {
    let messages: Vec<Message> = (0..n)
        .map(|i| {
            let m = Message::to(DEST)
                .json(&serde_json::json!({ "n": i }))
                .unwrap()
                .header("n", i.to_string())
                .header(
                    "traceparent",
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                );
            match key {
                Some(k) => m.key(k),
                None if i % 2 == 0 => m.key(format!("k{}", i % 3)),
                None => m,
            }
        })
        .collect();
    let mut tx = store.begin().await.unwrap();
    tx.enqueue_batch(&messages).await.unwrap();
    tx.commit().await.unwrap();
    messages
}

/// Publishes `payload` on `subject` with `headers`, as another service might, and
/// waits for the stream's acknowledgement.
async fn publish_raw(server: &Server, subject: &str, payload: Vec<u8>, headers: &[(&str, &str)]) {
    let js = jetstream::new(async_nats::connect(&server.url()).await.unwrap());
    let mut map = async_nats::HeaderMap::new();
    for (k, v) in headers {
        map.insert(*k, *v);
    }
    js.publish_with_headers(subject.to_owned(), map, payload.into())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// The durable consumer of [`DEST`] of [`receiver_config`].
async fn consumer_info(server: &Server) -> jetstream::consumer::Info {
    let js = jetstream::new(async_nats::connect(&server.url()).await.unwrap());
    let stream = js.get_stream(STREAM).await.unwrap();
    let consumer: jetstream::consumer::PullConsumer =
        stream.get_consumer(&format!("svc-b_{DEST}")).await.unwrap();
    consumer.get_info().await.unwrap()
}

/// Takes `n` messages from the receiver's durable consumer (made as the receiver makes
/// it) and acknowledges none: a receiver that died holding them.
async fn take_without_ack(server: &Server, n: usize) {
    take_without_ack_within(server, n, Duration::from_secs(2)).await;
}

/// As [`take_without_ack`], the consumer made with `ack_wait` (by a receiver
/// configured so).
async fn take_without_ack_within(server: &Server, n: usize, ack_wait: Duration) {
    use futures_util::StreamExt;
    let js = jetstream::new(async_nats::connect(&server.url()).await.unwrap());
    let c: jetstream::consumer::PullConsumer = js
        .get_stream(STREAM)
        .await
        .unwrap()
        .get_or_create_consumer(
            &format!("svc-b_{DEST}"),
            jetstream::consumer::pull::Config {
                durable_name: Some(format!("svc-b_{DEST}")),
                filter_subject: format!("agentsaga.{DEST}"),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait,
                max_deliver: -1,
                max_ack_pending: 4,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut got = c.fetch().max_messages(n).messages().await.unwrap();
    for _ in 0..n {
        let m = got.next().await.expect("a message").unwrap();
        assert_eq!(m.info().unwrap().delivered, 1);
    }
}
