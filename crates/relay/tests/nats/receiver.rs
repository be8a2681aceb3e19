//! The receiver: A's relay publishes, B's receiver stores (same id, key, payload,
//! headers); a redelivery or a second publish is stored once; a stop is clean.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_the_message_lands_in_b_as_it_left_a() {
    let server = Server::start();
    let (a, b) = (store().await, store().await);
    let relay = start_relay(&a, with_stream(&server).await).await;
    let receiver = start_receiver(&server, &b).await;

    let sent = enqueue(&a, 20, None).await;
    let rows = wait_rows(&b, 20).await;
    assert_eq!(rows.len(), 20, "{rows:?}");
    for m in &sent {
        let row = rows
            .iter()
            .find(|r| r.id == m.id)
            .expect("the message is in B");
        assert_eq!(row.destination, DEST);
        assert_eq!(row.key, m.key);
        assert_eq!(
            row.payload,
            serde_json::from_str::<serde_json::Value>(&m.payload).unwrap()
        );
        assert_eq!(row.headers, serde_json::to_value(&m.headers).unwrap());
        assert_eq!(row.state, "pending", "B's own relay delivers it");
    }
    // A's rows are delivered once the stream has them.
    wait_until("A's rows delivered", DEADLINE, async || {
        a.admin().stats().await.unwrap().delivered == 20
    })
    .await;
    // Acknowledged after the commit: nothing is left for the consumer.
    wait_until("all acknowledged", DEADLINE, async || {
        let info = consumer_info(&server).await;
        info.num_ack_pending == 0 && info.num_pending == 0
    })
    .await;
    let stats = receiver.stats();
    assert_eq!(
        (stats.received, stats.stored, stats.dead_lettered),
        (20, 20, 0)
    );
    relay.shutdown().await;
    stop(receiver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_or_a_second_publish_is_stored_once() {
    let server = Server::start();
    let b = store().await;
    let _stream = with_stream(&server).await;
    let env = envelope(DEST);
    let body = serde_json::to_vec(&env).unwrap();
    let subject = format!("agentsaga.{DEST}");
    // Published twice, each with a fresh Nats-Msg-Id: the stream keeps both.
    for _ in 0..2 {
        let msg_id = MessageId::new().to_string();
        publish_raw(&server, &subject, body.clone(), &[("Nats-Msg-Id", &msg_id)]).await;
    }
    // A receiver that took the first delivery and died before acknowledging it.
    take_without_ack(&server, 1).await;
    let receiver = start_receiver(&server, &b).await;
    wait_until("both deliveries handled", DEADLINE, async || {
        let info = consumer_info(&server).await;
        info.num_ack_pending == 0 && info.num_pending == 0
    })
    .await;
    let rows = outbox(&b).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].id, env.id);
    let stats = receiver.stats();
    assert_eq!(stats.received, 2, "{stats:?}");
    assert!(
        stats.redelivered >= 1,
        "the unacknowledged one came back: {stats:?}"
    );
    stop(receiver).await;

    // A restarted receiver (the same durable consumer) finds nothing new to store.
    let receiver = start_receiver(&server, &b).await;
    let again = serde_json::to_vec(&envelope(DEST)).unwrap();
    publish_raw(&server, &subject, again, &[]).await;
    wait_rows(&b, 2).await;
    assert_eq!(outbox(&b).await.len(), 2, "only the new message was added");
    assert_eq!(
        receiver.stats().received,
        1,
        "the stored ones were not delivered again"
    );
    stop(receiver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_receiver_takes_nothing_more() {
    let server = Server::start();
    let b = store().await;
    let _stream = with_stream(&server).await;
    let receiver = start_receiver(&server, &b).await;
    let subject = format!("agentsaga.{DEST}");
    publish_raw(
        &server,
        &subject,
        serde_json::to_vec(&envelope(DEST)).unwrap(),
        &[],
    )
    .await;
    wait_rows(&b, 1).await;
    tokio::time::timeout(Duration::from_secs(5), receiver.stop())
        .await
        .expect("the receiver stops within 5 s");

    // Published after the stop: the server holds it, undelivered.
    let later = envelope(DEST);
    publish_raw(&server, &subject, serde_json::to_vec(&later).unwrap(), &[]).await;
    let info = consumer_info(&server).await;
    assert_eq!((info.num_pending, info.num_ack_pending), (1, 0), "{info:?}");
    assert_eq!(outbox(&b).await.len(), 1);

    // A new receiver takes it from there.
    let receiver = start_receiver(&server, &b).await;
    let rows = wait_rows(&b, 2).await;
    assert_eq!(rows[1].id, later.id);
    stop(receiver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_destination_has_its_consumer_and_bad_setups_are_typed_errors() {
    let server = Server::start();
    let b = store().await;
    let config = receiver_config().destinations([DEST, "refunds.eu"]);
    // No stream yet.
    let err = NatsReceiver::start(&server.url(), b.clone(), config.clone())
        .await
        .expect_err("no stream");
    assert!(matches!(err, NatsError::Stream { .. }), "{err}");
    let bad = receiver_config().destinations(["pay*"]);
    let err = NatsReceiver::start(&server.url(), b.clone(), bad)
        .await
        .expect_err("a destination that is no subject");
    assert!(matches!(err, NatsError::Config(_)), "{err}");

    let _stream = with_stream(&server).await;
    let receiver = NatsReceiver::start(&server.url(), b.clone(), config)
        .await
        .unwrap();
    let (pay, refund) = (envelope(DEST), envelope("refunds.eu"));
    publish_raw(
        &server,
        "agentsaga.payments",
        serde_json::to_vec(&pay).unwrap(),
        &[],
    )
    .await;
    publish_raw(
        &server,
        "agentsaga.refunds.eu",
        serde_json::to_vec(&refund).unwrap(),
        &[],
    )
    .await;
    // Another service's destination on the same stream is not this receiver's.
    let other = envelope("calendar");
    publish_raw(
        &server,
        "agentsaga.calendar",
        serde_json::to_vec(&other).unwrap(),
        &[],
    )
    .await;
    let rows = wait_rows(&b, 2).await;
    let mut got: Vec<(MessageId, &str)> = rows
        .iter()
        .map(|r| (r.id, r.destination.as_str()))
        .collect();
    got.sort_by_key(|(_, d)| d.to_string());
    assert_eq!(got, [(pay.id, DEST), (refund.id, "refunds.eu")]);
    stop(receiver).await;
    let js = jetstream::new(async_nats::connect(&server.url()).await.unwrap());
    let stream = js.get_stream(STREAM).await.unwrap();
    for (name, filter) in [
        ("svc-b_payments", "agentsaga.payments"),
        ("svc-b_refunds_eu", "agentsaga.refunds.eu"),
    ] {
        let c: jetstream::consumer::PullConsumer = stream.get_consumer(name).await.unwrap();
        assert_eq!(c.cached_info().config.filter_subject, filter);
    }
    assert_eq!(outbox(&b).await.len(), 2, "calendar's message was taken");

    // A consumer of that name with another filter is refused, not used.
    stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("svc-c_payments".into()),
            filter_subject: "agentsaga.calendar".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let err = NatsReceiver::start(
        &server.url(),
        b.clone(),
        NatsReceiverConfig::new(STREAM, "svc-c").destinations([DEST]),
    )
    .await
    .expect_err("another filter");
    assert!(matches!(err, NatsError::Consumer { .. }), "{err}");
}

// The stream is a work queue: what a service acknowledged leaves it, and a destination
// has one consuming service: a second one is refused at its start (two would split the
// destination's messages, and its keys, between them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_leave_the_stream_and_a_destination_has_one_service() {
    let server = Server::start();
    let b = store().await;
    let _stream = with_stream(&server).await;
    let receiver = start_receiver(&server, &b).await;
    for _ in 0..3 {
        let env = envelope(DEST);
        publish_raw(
            &server,
            "agentsaga.payments",
            serde_json::to_vec(&env).unwrap(),
            &[],
        )
        .await;
    }
    wait_rows(&b, 3).await;
    let js = jetstream::new(async_nats::connect(&server.url()).await.unwrap());
    wait_until("the stream emptied", DEADLINE, async || {
        let mut stream = js.get_stream(STREAM).await.unwrap();
        stream.info().await.unwrap().state.messages == 0
    })
    .await;

    let err = NatsReceiver::start(
        &server.url(),
        store().await,
        NatsReceiverConfig::new(STREAM, "svc-other").destinations([DEST]),
    )
    .await
    .expect_err("a second service on one destination");
    assert!(matches!(err, NatsError::Consumer { .. }), "{err}");
    stop(receiver).await;
}

// Destinations that differ only in characters a right's name cannot hold used to share
// one right (`nats.S.svc-b_orders-eu` for both): the second consumer stood by forever,
// "another process of this service receives the destination".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destinations_alike_but_for_characters_a_right_cannot_hold_are_each_received() {
    let server = Server::start();
    let b = store().await;
    let nats = with_stream(&server).await;
    let destinations = ["orders-eu", "orders+eu", "paiement.é", "paiement.è"];
    let mut sent = Vec::new();
    for d in destinations {
        let env = envelope(d);
        assert_eq!(nats.deliver(&env).await, Delivery::Delivered, "{d}");
        sent.push(env);
    }
    let receiver = NatsReceiver::start(
        &server.url(),
        b.clone(),
        receiver_config().destinations(destinations),
    )
    .await
    .expect("start the receiver");
    let rows = wait_rows(&b, 4).await;
    for env in &sent {
        let row = rows.iter().find(|r| r.id == env.id).expect("stored");
        assert_eq!(
            (row.destination.as_str(), row.state.as_str()),
            (env.destination.as_str(), "pending")
        );
    }
    assert_eq!(
        receiver.stats().holding,
        4,
        "each consumer holds its own right"
    );
    stop(receiver).await;
}
