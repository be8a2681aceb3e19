//! The HTTP transport between two stores: a relay on store A POSTs to the receiving
//! router of store B, served in-process on 127.0.0.1. Every test body runs on SQLite
//! and PostgreSQL.

mod receiver;
mod stores;

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga_core::testing::{self, Backend, fresh_url};
use agentsaga_core::{Envelope, Message, MessageId, RetryPolicy, Sql, Store};
use agentsaga_relay::http::{self, HttpTransport, OUTBOX_PATH, ReceiverConfig};
use agentsaga_relay::{Delivery, Error, Relay, RelayConfig, Transport};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const TOKEN: &str = "test-token-0123456789";

/// How long any condition may take before a test fails.
const DEADLINE: Duration = Duration::from_secs(20);

async fn store(backend: Backend) -> Store {
    Store::connect(&fresh_url(backend).await)
        .await
        .expect("open the store")
}

/// An axum app served on a listener of this process, stopped by [`Server::stop`].
struct Server {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Server {
    async fn bind(app: Router) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::serve(listener, app)
    }

    fn serve(listener: TcpListener, app: Router) -> Self {
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
                .expect("serve");
        });
        Self { addr, stop, task }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(5), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

/// The ids and keys of the outbox rows of `destination`.
async fn rows(store: &Store, destination: &str) -> Vec<(MessageId, Option<String>)> {
    let rows = Sql::new("SELECT id, key FROM outbox WHERE destination = ? ORDER BY seq")
        .bind(destination)
        .fetch_all(store.reader())
        .await
        .expect("read the outbox");
    let rows: Vec<(String, Option<String>)> = rows
        .iter()
        .map(|r| (r.text("id").unwrap(), r.opt_text("key").unwrap()))
        .collect();
    rows.into_iter()
        .map(|(id, key)| (id.parse().expect("a uuid"), key))
        .collect()
}

/// Polls `condition` until it holds; fails the test after [`DEADLINE`].
async fn wait_until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    agentsaga_core::testing::wait_until(what, DEADLINE, async || condition().await).await;
}

async fn wait_delivered(relay: &Relay, n: u64) {
    wait_until(&format!("{n} rows are delivered"), || async {
        relay.stats().delivered >= n
    })
    .await;
}

/// Quick polls, short shutdowns; `retry` as given.
fn relay_config(retry: RetryPolicy) -> RelayConfig {
    RelayConfig::default()
        .poll_interval(Duration::from_millis(50))
        .retry(retry)
        .shutdown_timeout(Duration::from_secs(5))
}

async fn start_relay(store: &Store, destinations: &[&str], transport: impl Transport) -> Relay {
    start_relay_with(
        store,
        destinations,
        transport,
        relay_config(RetryPolicy::new(
            Duration::from_millis(5),
            Duration::from_millis(20),
            5,
        )),
    )
    .await
}

async fn start_relay_with(
    store: &Store,
    destinations: &[&str],
    transport: impl Transport,
    config: RelayConfig,
) -> Relay {
    Relay::start(
        store.clone(),
        destinations.iter().map(|d| (*d).to_owned()).collect(),
        Arc::new(transport),
        config,
    )
    .await
    .expect("start the relay")
}

/// 50 messages to `remote`, every other one keyed (5 keys), with a payload and a header.
async fn enqueue_fifty(store: &Store) -> Vec<Message> {
    let messages: Vec<Message> = (0..50)
        .map(|i| {
            let m = Message::to("remote")
                .json(&json!({ "i": i }))
                .expect("json")
                .header("n", i.to_string());
            if i % 2 == 0 {
                m.key(format!("k{}", i % 5))
            } else {
                m
            }
        })
        .collect();
    let mut tx = store.begin().await.expect("begin");
    for m in &messages {
        tx.enqueue(m).await.expect("enqueue");
    }
    tx.commit().await.expect("commit");
    messages
}

/// The receiving side's local destination: records what B's own relay delivers.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<Envelope>>>);

impl Collect {
    fn envelopes(&self) -> Vec<Envelope> {
        self.0.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl Transport for Collect {
    async fn deliver(&self, envelope: &Envelope) -> Delivery {
        self.0.lock().unwrap().push(envelope.clone());
        Delivery::Delivered
    }
}

fn ids(messages: &[Message]) -> HashSet<MessageId> {
    messages.iter().map(|m| m.id).collect()
}

/// Asserts that B holds exactly `sent`, once each, with their keys.
async fn assert_received_once(b: &Store, sent: &[Message]) {
    let rows = rows(b, "remote").await;
    assert_eq!(rows.len(), sent.len(), "rows in B: {rows:?}");
    let received: HashSet<MessageId> = rows.iter().map(|(id, _)| *id).collect();
    assert_eq!(received, ids(sent), "B holds other ids than A sent");
    for m in sent {
        let (_, key) = rows.iter().find(|(id, _)| *id == m.id).unwrap();
        assert_eq!(key.as_deref(), m.key.as_deref(), "key of {}", m.id);
    }
}

fn envelope(destination: &str, payload: &str) -> Envelope {
    Envelope {
        seq: 7,
        key: Some("order-1".to_owned()),
        created_at_ms: 1_700_000_000_000,
        ..testing::envelope(destination, payload, [("reply_to", "orders")])
    }
}

/// POSTs `body` to the server's outbox path, with `authorization` if given.
async fn post_raw(
    server: &Server,
    authorization: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> (StatusCode, HeaderMap, String) {
    let mut request = reqwest::Client::new()
        .post(server.url(OUTBOX_PATH))
        .header("content-type", "application/json")
        .body(body);
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let response = request.send().await.expect("POST");
    let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap())
}

async fn post_envelope(server: &Server, envelope: &Envelope) -> (StatusCode, String) {
    let bearer = format!("Bearer {TOKEN}");
    let (status, _, body) =
        post_raw(server, Some(&bearer), serde_json::to_vec(envelope).unwrap()).await;
    (status, body)
}
