//! The HTTP transport between two stores: a relay on store A POSTs to the receiving
//! router of store B, served in-process on 127.0.0.1. Every test body runs on SQLite
//! and PostgreSQL.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga_core::testing::{self, Backend, fresh_url};
use agentsaga_core::{Envelope, Message, MessageId, ReadPool, RetryPolicy, Store, sqlx};
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
    let rows: Vec<(String, Option<String>)> = match store.reader() {
        ReadPool::Sqlite(reader) => {
            sqlx::query_as("SELECT id, key FROM outbox WHERE destination = ? ORDER BY seq")
                .bind(destination)
                .fetch_all(reader)
                .await
        }
        ReadPool::Postgres(pool) => {
            sqlx::query_as("SELECT id::text, key FROM outbox WHERE destination = $1 ORDER BY seq")
                .bind(destination)
                .fetch_all(pool)
                .await
        }
    }
    .expect("read the outbox");
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
    let config = relay_config(RetryPolicy::new(
        Duration::from_millis(50),
        Duration::from_millis(200),
        50,
    ))
    .breaker_cooldown(Duration::from_millis(200));
    let relay_a = start_relay_with(&a, &["remote"], transport, config).await;

    let sent = enqueue_fifty(&a).await;
    wait_until("deliveries to the absent receiver failed", || async {
        relay_a.stats().retried >= 10
    })
    .await;
    let sa = a.admin().stats().await.unwrap();
    assert_eq!((sa.delivered, sa.dead), (0, 0), "{sa:?}");
    assert_eq!(sa.pending + sa.in_flight, 50, "{sa:?}");
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

async fn refusals_write_nothing(backend: Backend) {
    let b = store(backend).await;
    assert!(matches!(
        http::router(b.clone(), ReceiverConfig::new("")),
        Err(Error::Config(_))
    ));
    let config = ReceiverConfig::new(TOKEN)
        .max_body_bytes(1024)
        .destinations(["remote"]);
    let server = Server::bind(http::router(b.clone(), config).unwrap()).await;
    let before = b.admin().stats().await.unwrap();
    let good = serde_json::to_vec(&envelope("remote", "1")).unwrap();
    let bearer = format!("Bearer {TOKEN}");

    // Authentication first, before the body is even read.
    for auth in [
        None,
        Some("Bearer wrong-token"),
        Some("Bearer test-token-012345678"),
        Some(format!("Basic {TOKEN}").as_str()),
        Some(TOKEN),
    ] {
        let (status, headers, body) = post_raw(&server, auth, good.clone()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{auth:?}: {body}");
        assert_eq!(headers["www-authenticate"], "Bearer");
    }
    let huge =
        serde_json::to_vec(&envelope("remote", &json!("x".repeat(4096)).to_string())).unwrap();
    assert_eq!(
        post_raw(&server, Some("Bearer nope"), huge.clone()).await.0,
        StatusCode::UNAUTHORIZED
    );

    let (status, _, body) = post_raw(&server, Some(&bearer), huge).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");

    for (bad, expected) in [
        (b"{not json".to_vec(), "malformed envelope"),
        (b"".to_vec(), "malformed envelope"),
        (br#"{"hello":1}"#.to_vec(), "missing field"),
        (
            serde_json::to_vec(&envelope("remote", "not json")).unwrap(),
            "payload is not JSON",
        ),
        (
            serde_json::to_vec(&envelope(" ", "1")).unwrap(),
            "destination is empty",
        ),
    ] {
        let (status, _, body) = post_raw(&server, Some(&bearer), bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body.contains(expected), "{expected:?} not in {body:?}");
    }
    let (status, _, body) = post_raw(
        &server,
        Some(&bearer),
        serde_json::to_vec(&envelope("elsewhere", "1")).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("elsewhere"), "{body}");

    assert_eq!(
        b.admin().stats().await.unwrap(),
        before,
        "a refusal wrote something"
    );
    assert!(rows(&b, "remote").await.is_empty());
    assert!(rows(&b, "elsewhere").await.is_empty());

    // The same server takes a good one (the bearer scheme in any case) ...
    let (status, _, body) = post_raw(&server, Some(&format!("bearer {TOKEN}")), good.clone()).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(rows(&b, "remote").await.len(), 1);

    // ... and answers 503 (the sender retries) when its database fails.
    b.close().await;
    let (status, _, body) = post_raw(
        &server,
        Some(&bearer),
        serde_json::to_vec(&envelope("remote", "2")).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    server.stop().await;
}
agentsaga_core::both_backends!(refusals, refusals_write_nothing);

/// One scripted answer of [`scripted_receiver`].
#[derive(Debug, Clone, Copy)]
enum Answer {
    Status(u16),
    TooManyRequests {
        retry_after_s: u64,
    },
    /// Answers 204, after longer than the client waits.
    Slow,
}

#[derive(Default)]
struct Script {
    answers: Mutex<VecDeque<Answer>>,
    /// (when, the envelope's attempt, the Authorization header) per request.
    calls: Mutex<Vec<(Instant, u32, String)>>,
}

/// A receiver of our own: `/flaky` answers from the script (then 204), `/strict` 409
/// with a long body.
fn scripted_receiver(script: Arc<Script>) -> Router {
    async fn flaky(State(script): State<Arc<Script>>, headers: HeaderMap, body: Bytes) -> Response {
        let envelope: Envelope = serde_json::from_slice(&body).expect("an envelope");
        let auth = headers["authorization"].to_str().unwrap().to_owned();
        assert_eq!(headers["content-type"], "application/json");
        script
            .calls
            .lock()
            .unwrap()
            .push((Instant::now(), envelope.attempts, auth));
        let answer = script.answers.lock().unwrap().pop_front();
        match answer {
            Some(Answer::Status(code)) => {
                (StatusCode::from_u16(code).unwrap(), "boom").into_response()
            }
            Some(Answer::TooManyRequests { retry_after_s }) => (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", retry_after_s.to_string())],
            )
                .into_response(),
            Some(Answer::Slow) => {
                tokio::time::sleep(Duration::from_secs(2)).await;
                StatusCode::NO_CONTENT.into_response()
            }
            None => StatusCode::NO_CONTENT.into_response(),
        }
    }
    async fn strict() -> Response {
        let body = format!("conflict: order already exists {}", "x".repeat(2000));
        (StatusCode::CONFLICT, body).into_response()
    }
    Router::new()
        .route("/flaky", post(flaky))
        .route("/strict", post(strict))
        .with_state(script)
}

async fn client_maps_answers(backend: Backend) {
    let a = store(backend).await;
    let script = Arc::new(Script::default());
    script.answers.lock().unwrap().extend([
        Answer::Status(500),
        Answer::Slow,
        Answer::Status(503),
        Answer::TooManyRequests { retry_after_s: 1 },
    ]);
    let server = Server::bind(scripted_receiver(Arc::clone(&script))).await;
    let transport = HttpTransport::new(TOKEN)
        .route("flaky", server.url("/flaky"))
        .route("strict", server.url("/strict"))
        .route("tls", "https://127.0.0.1:9/outbox")
        .timeout(Duration::from_millis(300));
    let config = relay_config(RetryPolicy::new(
        Duration::from_millis(10),
        Duration::from_millis(50),
        10,
    ))
    .breaker_threshold(0);
    let relay = start_relay_with(
        &a,
        &["flaky", "strict", "tls", "unrouted"],
        transport,
        config,
    )
    .await;

    let mut tx = a.begin().await.unwrap();
    for destination in ["flaky", "strict", "tls", "unrouted"] {
        tx.enqueue(&Message::to(destination).key(destination))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    wait_until("one row delivered and three dead", || async {
        let s = relay.stats();
        s.delivered == 1 && s.dead == 3
    })
    .await;

    // 5xx, a timeout, 503 and 429: retries; then 204.
    let calls = script.calls.lock().unwrap().clone();
    let attempts: Vec<u32> = calls.iter().map(|c| c.1).collect();
    assert_eq!(attempts, [1, 2, 3, 4, 5]);
    assert!(
        calls.iter().all(|c| c.2 == format!("Bearer {TOKEN}")),
        "{calls:?}"
    );
    let waited = calls[4].0 - calls[3].0;
    assert!(
        waited >= Duration::from_millis(950),
        "Retry-After: 1 ignored: retried after {waited:?}"
    );
    assert_eq!(relay.stats().retried, 4);

    // 4xx: dead at once, the status and the start of the body kept.
    let error = |destination: &'static str| {
        let a = a.clone();
        async move {
            let dead = a.admin().dead_letters(Some(destination), 10).await.unwrap();
            assert_eq!(dead.len(), 1, "{destination}: {dead:?}");
            assert_eq!(dead[0].envelope.attempts, 1, "{destination}");
            dead[0].last_error.clone().unwrap()
        }
    };
    let strict = error("strict").await;
    assert!(strict.contains("409 Conflict"), "{strict}");
    assert!(
        strict.contains("conflict: order already exists"),
        "{strict}"
    );
    assert!(
        strict.chars().count() < 700,
        "not truncated: {} chars",
        strict.chars().count()
    );
    assert!(error("tls").await.contains("not an http:// URL"));
    assert_eq!(error("unrouted").await, "no route for destination unrouted");
    relay.shutdown().await;
    server.stop().await;
}
agentsaga_core::both_backends!(client_answers, client_maps_answers);
