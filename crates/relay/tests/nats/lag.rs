//! The broker's view of the consumers ([`consumer_lag`]) against a real server: what is
//! published and not delivered, delivered and not acknowledged, and delivered again.

use agentsaga_relay::nats::{ConsumerLag, consumer_lag};
use async_nats::jetstream::AckKind;
use futures_util::StreamExt;

use super::*;

/// A durable pull consumer on `subject` with explicit acks, as a receiver makes one.
async fn durable(
    js: &jetstream::Context,
    name: &str,
    subject: &str,
) -> jetstream::consumer::PullConsumer {
    js.get_stream(STREAM)
        .await
        .unwrap()
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some(name.to_owned()),
            filter_subject: subject.to_owned(),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(60),
            max_deliver: -1,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// The next message of `c` (waiting up to 5 s).
async fn next(c: &jetstream::consumer::PullConsumer) -> jetstream::Message {
    let mut batch = c
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(5))
        .messages()
        .await
        .unwrap();
    batch.next().await.expect("a message").unwrap()
}

#[tokio::test]
async fn pending_in_hand_and_redelivered_as_the_broker_counts_them() {
    let server = Server::start();
    let nats = with_stream(&server).await;
    for _ in 0..5 {
        assert_eq!(nats.deliver(&envelope(DEST)).await, Delivery::Delivered);
    }
    assert_eq!(
        nats.deliver(&envelope("saga.order.v1")).await,
        Delivery::Delivered
    );
    for region in ["eu", "us"] {
        let refund = envelope(&format!("refunds.{region}"));
        assert_eq!(nats.deliver(&refund).await, Delivery::Delivered);
    }
    let js = jetstream::new(async_nats::connect(&server.url()).await.unwrap());
    let payments = durable(&js, "svc-b_payments", "agentsaga.payments").await;
    durable(&js, "shop_saga_order_v1", "agentsaga.saga.order.v1").await;
    // A filter of more than one destination (the stream is a work queue: filters do
    // not overlap).
    durable(&js, "tap", "agentsaga.refunds.*").await;

    // Of 5: one acknowledged, one handed back and taken again, three not delivered.
    next(&payments).await.double_ack().await.unwrap();
    next(&payments)
        .await
        .double_ack_with(AckKind::Nak(None))
        .await
        .unwrap();
    let again = next(&payments).await;
    assert_eq!(again.info().unwrap().delivered, 2, "the nak'ed one again");

    let lag = consumer_lag(&js, STREAM).await.unwrap();
    let got: Vec<(&str, Option<&str>, u64, u64, u64)> = lag
        .iter()
        .map(|l: &ConsumerLag| {
            (
                l.consumer.as_str(),
                l.destination.as_deref(),
                l.pending,
                l.ack_pending,
                l.redelivered,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("shop_saga_order_v1", Some("saga.order.v1"), 1, 0, 0),
            ("svc-b_payments", Some("payments"), 3, 1, 1),
            ("tap", None, 2, 0, 0),
        ]
    );
    assert_eq!(lag[2].filter_subject, "agentsaga.refunds.*");
    // The transport's own reading says the same.
    assert_eq!(nats.consumer_lag(STREAM).await.unwrap(), lag);

    // Acknowledged, it leaves the service's hands.
    again.double_ack().await.unwrap();
    let lag = consumer_lag(&js, STREAM).await.unwrap();
    assert_eq!((lag[1].pending, lag[1].ack_pending), (3, 0));
}

#[tokio::test]
async fn a_missing_stream_is_an_error() {
    let server = Server::start();
    let js = jetstream::new(async_nats::connect(&server.url()).await.unwrap());
    assert!(matches!(
        consumer_lag(&js, "NOPE").await,
        Err(NatsError::Stream { stream, .. }) if stream == "NOPE"
    ));
}
