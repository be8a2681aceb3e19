//! The transport against a real server: what it publishes, a duplicate kept once, no
//! stream retried, a destination that is no subject rejected.

use super::*;

/// The messages of the stream, read by a throwaway pull consumer.
async fn read_all(url: &str, n: usize) -> Vec<async_nats::jetstream::Message> {
    use futures_util::StreamExt;
    let js = jetstream::new(async_nats::connect(url).await.unwrap());
    let stream = js.get_stream(STREAM).await.unwrap();
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config::default())
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(n)
        .expires(Duration::from_secs(2))
        .messages()
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Some(m) = batch.next().await {
        out.push(m.unwrap());
    }
    out
}

#[tokio::test]
async fn delivered_with_its_id_headers_and_envelope() {
    let server = Server::start();
    let nats = with_stream(&server).await;
    let env = envelope("payments");
    assert_eq!(nats.deliver(&env).await, Delivery::Delivered);
    let got = read_all(&server.url(), 10).await;
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!(m.subject.as_str(), "agentsaga.payments");
    let headers = m.headers.as_ref().expect("headers");
    assert_eq!(
        headers.get("Nats-Msg-Id").map(|v| v.as_str()),
        Some(env.id.to_string().as_str())
    );
    assert_eq!(
        headers.get("traceparent").map(|v| v.as_str()),
        Some(env.headers["traceparent"].as_str())
    );
    let decoded: Envelope = serde_json::from_slice(&m.payload).unwrap();
    assert_eq!(decoded, env);
}

#[tokio::test]
async fn a_second_publish_of_one_message_is_kept_once() {
    let server = Server::start();
    let nats = with_stream(&server).await;
    let env = envelope("payments");
    assert_eq!(nats.deliver(&env).await, Delivery::Delivered);
    // A relay that delivered, then crashed before marking the row, delivers again.
    assert_eq!(nats.deliver(&env).await, Delivery::Delivered);
    assert_eq!(read_all(&server.url(), 10).await.len(), 1);
}

#[tokio::test]
async fn without_a_stream_the_destination_is_unavailable() {
    let server = Server::start();
    let nats = NatsTransport::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(3));
    let outcome = nats.deliver(&envelope("payments")).await;
    assert!(
        matches!(outcome, Delivery::Unavailable { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_destination_that_is_no_subject_is_rejected() {
    let server = Server::start();
    let nats = NatsTransport::connect(&server.url()).await.unwrap();
    for bad in [
        "",
        "pay ments",
        "pay.*",
        "pay.>",
        "pay..ments",
        "pay\nments",
        "pay\u{0}ments",
        "pay\u{7f}",
    ] {
        let outcome = nats.deliver(&envelope(bad)).await;
        assert!(
            matches!(outcome, Delivery::Reject { .. }),
            "{bad:?}: {outcome:?}"
        );
    }
}

/// Headers NATS cannot carry as they are (an LLM's step name with a line break, a
/// space or non-ASCII in a name, `:`), as a saga may write them.
fn awkward_headers() -> Vec<(&'static str, &'static str)> {
    vec![
        ("step", "charge\nnow"),
        ("x-crlf\r\n", "a\r\nb"),
        ("with space", "a b"),
        ("naïve", "é ü"),
        ("pct%", "100%"),
        ("a:b", ""),
        ("Nats-Rollup", "all"),
        ("", "no name"),
    ]
}

// Publishing them used to panic inside the client (its header checks assert): the
// delivery became a retry, then a dead letter. On the wire they are percent-encoded;
// the envelope in the body holds them as they are.
#[tokio::test]
async fn headers_nats_cannot_carry_are_percent_encoded_on_the_wire() {
    let server = Server::start();
    let nats = with_stream(&server).await;
    let mut env = envelope("payments");
    for (k, v) in awkward_headers() {
        env.headers.insert(k.to_owned(), v.to_owned());
    }
    assert_eq!(nats.deliver(&env).await, Delivery::Delivered);
    let got = read_all(&server.url(), 10).await;
    assert_eq!(got.len(), 1);
    let headers = got[0].headers.as_ref().expect("headers");
    let wire = |k: &str| headers.get(k).map(|v| v.as_str().to_owned());
    assert_eq!(wire("step").as_deref(), Some("charge%0Anow"));
    assert_eq!(wire("x-crlf%0D%0A").as_deref(), Some("a%0D%0Ab"));
    assert_eq!(wire("with%20space").as_deref(), Some("a%20b"));
    assert_eq!(wire("na%C3%AFve").as_deref(), Some("%C3%A9%20%C3%BC"));
    assert_eq!(wire("pct%25").as_deref(), Some("100%25"));
    assert_eq!(wire("a%3Ab").as_deref(), Some(""));
    // A saga's header never gives the server an instruction (this one purges).
    assert_eq!(wire("%4Eats-Rollup").as_deref(), Some("all"));
    assert_eq!(wire("Nats-Rollup"), None);
    assert_eq!(
        wire("traceparent").as_deref(),
        Some(env.headers["traceparent"].as_str()),
        "a header NATS carries is unchanged"
    );
    let decoded: Envelope = serde_json::from_slice(&got[0].payload).unwrap();
    assert_eq!(decoded, env, "the envelope keeps them as they are");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_nats_cannot_carry_arrive_intact() {
    let server = Server::start();
    let (a, b) = (store().await, store().await);
    let relay = start_relay(&a, with_stream(&server).await).await;
    let receiver = start_receiver(&server, &b).await;
    let mut m = Message::to(DEST)
        .json(&serde_json::json!({"n": 1}))
        .unwrap();
    for (k, v) in awkward_headers() {
        m = m.header(k, v);
    }
    let mut tx = a.begin().await.unwrap();
    tx.enqueue_batch(std::slice::from_ref(&m)).await.unwrap();
    tx.commit().await.unwrap();
    let rows = wait_rows(&b, 1).await;
    assert_eq!(rows[0].id, m.id);
    assert_eq!(rows[0].state, "pending");
    assert_eq!(rows[0].headers, serde_json::to_value(&m.headers).unwrap());
    relay.shutdown().await;
    stop(receiver).await;
}
