//! What the receiver refuses, and how the client maps its answers.

use super::*;

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

    // 5xx and a timeout: retries, each spending an attempt; 503 and 429 (the service
    // says "not now"): the attempt given back; then 204.
    let calls = script.calls.lock().unwrap().clone();
    let attempts: Vec<u32> = calls.iter().map(|c| c.1).collect();
    assert_eq!(attempts, [1, 2, 3, 3, 3]);
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

// A message the receiving database refuses for what it holds (PostgreSQL's JSONB takes
// no `\u0000`; a SQLite sender stores it) is a 500, not a 503: the sender spends its
// attempts and dead-letters it, instead of waiting for it forever as for a store away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_the_database_refuses_is_no_outage() {
    let b = store(Backend::Postgres).await;
    let server = Server::bind(http::router(b.clone(), ReceiverConfig::new(TOKEN)).unwrap()).await;
    let body = serde_json::to_vec(&envelope("remote", r#"{"note":"a\u0000b"}"#)).unwrap();
    let (status, _, text) = post_raw(&server, Some(&format!("Bearer {TOKEN}")), body).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{text}");
    assert!(rows(&b, "remote").await.is_empty());
    server.stop().await;
}
