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
async fn without_a_stream_the_delivery_is_retried() {
    let server = Server::start();
    let nats = NatsTransport::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(3));
    let outcome = nats.deliver(&envelope("payments")).await;
    assert!(matches!(outcome, Delivery::Retry { .. }), "{outcome:?}");
}

#[tokio::test]
async fn a_destination_that_is_no_subject_is_rejected() {
    let server = Server::start();
    let nats = NatsTransport::connect(&server.url()).await.unwrap();
    for bad in ["", "pay ments", "pay.*", "pay.>", "pay..ments"] {
        let outcome = nats.deliver(&envelope(bad)).await;
        assert!(
            matches!(outcome, Delivery::Reject { .. }),
            "{bad:?}: {outcome:?}"
        );
    }
}
