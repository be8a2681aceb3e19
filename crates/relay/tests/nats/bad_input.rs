//! Bad input is dead-lettered in the receiving store with a reason that names the
//! problem, terminated on the stream, and the receiver goes on with the next message.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_dead_lettered_with_its_reason_and_the_next_one_stored() {
    let server = Server::start();
    let b = store_with(StoreConfig::default().max_message_bytes(2048)).await;
    let _stream = with_stream(&server).await;
    let subject = format!("agentsaga.{DEST}");
    let body = |e: &Envelope| serde_json::to_vec(e).unwrap();

    let elsewhere = envelope("refunds");
    let not_json = Envelope {
        payload: "not json {".into(),
        ..envelope(DEST)
    };
    let too_large = Envelope {
        payload: serde_json::json!("x".repeat(4000)).to_string(),
        ..envelope(DEST)
    };
    let good = envelope(DEST);
    publish_raw(&server, &subject, b"this is \"not\" JSON".to_vec(), &[]).await;
    publish_raw(&server, &subject, body(&elsewhere), &[]).await;
    publish_raw(&server, &subject, body(&not_json), &[]).await;
    publish_raw(&server, &subject, body(&too_large), &[]).await;
    publish_raw(&server, &subject, body(&good), &[]).await;

    let receiver = start_receiver(&server, &b).await;
    let rows = wait_rows(&b, 5).await;
    let states: Vec<&str> = rows.iter().map(|r| r.state.as_str()).collect();
    assert_eq!(
        states,
        ["dead", "dead", "dead", "dead", "pending"],
        "{rows:?}"
    );
    assert_eq!(
        rows[4].id, good.id,
        "the good one after the bad ones is stored"
    );
    let reason = |i: usize| rows[i].last_error.clone().unwrap_or_default();

    // Not an envelope: its text kept as a JSON string, where it came from in headers.
    assert!(reason(0).contains("malformed envelope"), "{}", reason(0));
    assert_eq!(rows[0].payload, serde_json::json!("this is \"not\" JSON"));
    assert_eq!(rows[0].headers["nats_subject"], subject.as_str());
    assert_eq!(rows[0].headers["nats_stream_seq"], "1");
    assert_eq!(rows[0].destination, DEST);
    // Another destination than its subject's: kept whole, under the subject's.
    assert!(
        reason(1).contains("`refunds`") && reason(1).contains("not its subject's"),
        "{}",
        reason(1)
    );
    assert_eq!(rows[1].id, elsewhere.id);
    assert_eq!(rows[1].payload, serde_json::json!({"amount": 42}));
    assert_eq!(rows[1].key.as_deref(), Some("order-7"));
    // A payload that is not JSON: kept as a JSON string.
    assert!(reason(2).contains("payload is not JSON"), "{}", reason(2));
    assert_eq!(
        (rows[2].id, &rows[2].payload),
        (not_json.id, &serde_json::json!("not json {"))
    );
    // Too large for the store: cut to fit, the reason says so.
    assert!(
        reason(3).contains("over the limit of 2048 bytes"),
        "{}",
        reason(3)
    );
    assert_eq!(rows[3].id, too_large.id);
    let kept = rows[3].payload.as_str().expect("a JSON string");
    assert!(kept.len() < 2048 && kept.starts_with("\"xxx"), "{kept:.40}");
    assert_eq!(rows[3].headers["nats_stream_seq"], "4");

    // The operator's view lists them, with their reasons.
    let dead = b.admin().dead_letters(Some(DEST), 10).await.unwrap();
    assert_eq!(dead.len(), 4);
    assert!(dead.iter().all(|d| d.last_error.is_some()));
    // Terminated or acknowledged on the stream: nothing comes back.
    wait_until("all acknowledged", DEADLINE, async || {
        let info = consumer_info(&server).await;
        info.num_ack_pending == 0 && info.num_pending == 0
    })
    .await;
    let stats = receiver.stats();
    assert_eq!((stats.dead_lettered, stats.stored), (4, 1), "{stats:?}");
    stop(receiver).await;
}

// A message dead-lettered on arrival that names a `reply_to` (a saga's command) is
// answered as the relay answers a local dead letter: a `DeliveryFailed` notice to its
// `reply_to`, in the transaction that writes the dead letter, published back by the
// service's relay. A second copy of the message writes neither twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_on_arrival_sends_delivery_failed_to_its_reply_to_once() {
    let server = Server::start();
    let b = store_with(StoreConfig::default().max_message_bytes(2048)).await;
    let _stream = with_stream(&server).await;
    let subject = format!("agentsaga.{DEST}");
    let mut too_large = Envelope {
        payload: serde_json::json!("x".repeat(4000)).to_string(),
        ..envelope(DEST)
    };
    too_large
        .headers
        .insert("reply_to".into(), "saga.order.v1".into());
    too_large.headers.insert("saga_id".into(), "s-1".into());
    let body = serde_json::to_vec(&too_large).unwrap();
    for _ in 0..2 {
        let msg_id = MessageId::new().to_string();
        publish_raw(&server, &subject, body.clone(), &[("Nats-Msg-Id", &msg_id)]).await;
    }
    let receiver = start_receiver(&server, &b).await;
    wait_until("both copies taken", DEADLINE, async || {
        let info = consumer_info(&server).await;
        info.num_ack_pending == 0 && info.num_pending == 0
    })
    .await;
    let rows = outbox(&b).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!((rows[0].id, rows[0].state.as_str()), (too_large.id, "dead"));
    let notice = &rows[1];
    assert_eq!(
        (notice.destination.as_str(), notice.state.as_str()),
        ("saga.order.v1", "pending")
    );
    assert_eq!(notice.headers["kind"], "delivery_failed");
    assert_eq!(
        notice.headers["causation_id"],
        too_large.id.to_string().as_str()
    );
    assert_eq!(notice.headers["saga_id"], "s-1");
    assert_eq!(
        notice.payload["message_id"],
        too_large.id.to_string().as_str()
    );
    let reason = notice.payload["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("over the limit of 2048 bytes"), "{reason}");
    stop(receiver).await;
}

// A body that is no envelope, published with a saga's headers (another service's
// publisher, a broken one): its NATS headers, decoded, name the `reply_to` to tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_no_envelope_tells_the_reply_to_of_its_headers() {
    let server = Server::start();
    let b = store().await;
    let _stream = with_stream(&server).await;
    let id = MessageId::new();
    publish_raw(
        &server,
        &format!("agentsaga.{DEST}"),
        b"{ broken".to_vec(),
        &[
            ("Nats-Msg-Id", &id.to_string()),
            ("reply_to", "saga.order.v1"),
            ("kind", "command"),
            ("step_name", "charge%0Anow"),
        ],
    )
    .await;
    let receiver = start_receiver(&server, &b).await;
    let rows = wait_rows(&b, 2).await;
    assert_eq!((rows[0].id, rows[0].state.as_str()), (id, "dead"));
    let notice = &rows[1];
    assert_eq!(notice.destination, "saga.order.v1");
    assert_eq!(notice.headers["kind"], "delivery_failed");
    assert_eq!(notice.headers["step_name"], "charge\nnow");
    assert_eq!(notice.payload["message_id"], id.to_string().as_str());
    let reason = notice.payload["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("malformed envelope"), "{reason}");
    stop(receiver).await;
}
