//! What the wire format asks of a consumer in another language (docs/remote.md), held by
//! the Python agent: a batch stops at its first message that cannot be written (that one
//! and the rest handed back at once, so an undo never lands before its do), a command's
//! `timeout_ms` is honoured, the stream it makes is agentsaga's work queue, and the
//! headers it publishes are percent-encoded where NATS needs it.
//!
//! The commands are published as agentsaga's relay publishes them (`NatsTransport`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agentsaga_core::Envelope;
use agentsaga_core::testing::{Backend, NatsServer, envelope, fresh_url};
use agentsaga_relay::Delivery;
use agentsaga_relay::Transport;
use agentsaga_relay::nats::NatsTransport;
use async_nats::jetstream;

use super::python::{PythonAgent, python_db};

/// A fresh directory for the agent's database and log.
async fn dir() -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(
        fresh_url(Backend::Sqlite)
            .await
            .trim_start_matches("sqlite://"),
    )
    .parent()
    .expect("a fresh directory")
    .to_owned();
    (dir.join("payments.db"), dir.join("payments.log"))
}

/// A command (or, with `undo`, its compensation) of saga `saga`'s step 1 to `payments`,
/// keyed as a saga's step is, with `headers` besides.
fn command(saga: &str, undo: bool, headers: &[(&str, &str)]) -> Envelope {
    let kind = if undo { "compensate" } else { "command" };
    let mut env = envelope(
        "payments",
        r#"{"amount":42}"#,
        [
            ("kind", kind),
            ("saga_id", saga),
            ("step", "1"),
            ("step_name", "charge"),
            ("reply_to", "saga.order.v1"),
        ],
    );
    env.key = Some(format!("{saga}:1"));
    for (k, v) in headers {
        env.headers.insert((*k).to_owned(), (*v).to_owned());
    }
    env
}

/// Publishes `envelopes` in order as agentsaga's relay does, the stream made as
/// `NatsLink::connect` makes it.
async fn publish(server: &NatsServer, envelopes: &[Envelope]) {
    let nats = NatsTransport::connect(&server.url()).await.unwrap();
    nats.ensure_stream("AGENTSAGA", Duration::from_secs(120))
        .await
        .unwrap();
    for env in envelopes {
        assert_eq!(nats.deliver(env).await, Delivery::Delivered);
    }
}

/// Waits (bounded) until the agent's inbox holds `n` messages and its outbox is all
/// published.
async fn wait_handled(db: &Path, log: &Path, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if db.exists() {
            let (_, _, [inbox, _, unpublished]) = python_db(db).await;
            if inbox >= n && unpublished == 0 {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not handle {n} messages within 30 s; its log: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The replies the agent published, as the stream holds them: their NATS headers and
/// their envelopes.
async fn replies(server: &NatsServer, n: usize) -> Vec<(async_nats::HeaderMap, Envelope)> {
    use futures_util::StreamExt;
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let consumer = js
        .get_stream("AGENTSAGA")
        .await
        .unwrap()
        .create_consumer(jetstream::consumer::pull::Config {
            filter_subject: "agentsaga.saga.order.v1".into(),
            ..Default::default()
        })
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
        let m = m.unwrap();
        let env: Envelope = serde_json::from_slice(&m.payload).expect("a reply envelope");
        out.push((m.headers.clone().unwrap_or_default(), env));
    }
    out
}

// A command whose write fails, with its compensation behind it in the same batch: the
// batch stops there and both are handed back, so the charge lands before its refund
// (it used to be naked with a delay while the refund went on: `[undo, do]`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_fails_hands_back_the_rest_of_the_batch_and_order_holds() {
    let server = NatsServer::start();
    let (db, log) = dir().await;
    let sent = [
        command("s1", false, &[]),
        command("s1", true, &[]),
        command("s2", false, &[]),
        command("s2", true, &[]),
    ];
    publish(&server, &sent).await;
    let agent = PythonAgent::start_with(&server.url(), &db, &log, &["--fail-writes", "1"]);
    wait_handled(&db, &log, 4).await;
    let (effects, dead, [inbox, outbox, _]) = python_db(&db).await;
    let status = agent.stop(&log);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status:?}: {log}");
    assert!(log.contains("handed back"), "no write failed: {log}");
    let effects: Vec<(&str, &str)> = effects
        .iter()
        .map(|(s, e)| (s.as_str(), e.as_str()))
        .collect();
    assert_eq!(
        effects,
        [
            ("s1", "payments/do"),
            ("s1", "payments/undo"),
            ("s2", "payments/do"),
            ("s2", "payments/undo"),
        ],
        "{log}"
    );
    assert_eq!((inbox, outbox, dead.len()), (4, 4, 0));
}

// A command's `timeout_ms` counts from when the agent takes it: a charge that takes
// longer is dropped, nothing applied, and a `timeout` answer goes to its `reply_to`; one
// within its time is applied and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_past_its_timeout_ms_is_answered_timeout_and_not_applied() {
    let server = NatsServer::start();
    let (db, log) = dir().await;
    let (late, on_time) = (
        command("late", false, &[("timeout_ms", "100")]),
        command("on-time", false, &[("timeout_ms", "20000")]),
    );
    publish(&server, &[late.clone(), on_time.clone()]).await;
    let agent = PythonAgent::start_with(&server.url(), &db, &log, &["--charge-ms", "600"]);
    wait_handled(&db, &log, 2).await;
    let (effects, _, _) = python_db(&db).await;
    let status = agent.stop(&log);
    assert!(status.success(), "{status:?}");
    assert_eq!(effects, [("on-time".to_owned(), "payments/do".to_owned())]);
    let answers: Vec<(String, String, String)> = replies(&server, 2)
        .await
        .into_iter()
        .map(|(_, env)| {
            let h = |k: &str| env.header(k).unwrap_or_default().to_owned();
            (h("causation_id"), h("kind"), env.payload.clone())
        })
        .collect();
    assert_eq!(
        answers,
        [
            (late.id.to_string(), "timeout".to_owned(), "null".to_owned()),
            (
                on_time.id.to_string(),
                "reply".to_owned(),
                r#"{"ok": {"by": "payments"}}"#.to_owned()
            ),
        ]
    );
}

// Started before any agentsaga service, the agent makes the stream exactly as
// `NatsLink::connect` does: a work queue over `agentsaga.>` with a 2-minute duplicate
// window (it used to make one with limits retention, which keeps what was acknowledged
// and gives a second consumer copies). Its replies' NATS headers are percent-encoded
// where NATS needs it (a step name with a line break and non-ASCII), and the envelope
// keeps them as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_makes_agentsagas_stream_and_encodes_its_headers() {
    let server = NatsServer::start();
    let (db, log) = dir().await;
    let agent = PythonAgent::start_with(&server.url(), &db, &log, &[]);
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let config = js
        .get_stream("AGENTSAGA")
        .await
        .expect("the agent made the stream")
        .info()
        .await
        .unwrap()
        .config
        .clone();
    assert_eq!(
        config.retention,
        jetstream::stream::RetentionPolicy::WorkQueue
    );
    assert_eq!(config.subjects, ["agentsaga.>"]);
    assert_eq!(config.duplicate_window, Duration::from_secs(120));

    let mut odd = command("s1", false, &[]);
    odd.headers
        .insert("step_name".into(), "charge\nnow é 100%".into());
    publish(&server, &[odd]).await;
    wait_handled(&db, &log, 1).await;
    assert!(agent.stop(&log).success());
    let got = replies(&server, 1).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let (nats, env) = &got[0];
    assert_eq!(env.header("step_name"), Some("charge\nnow é 100%"));
    assert_eq!(
        nats.get("step_name").map(|v| v.as_str()),
        Some("charge%0Anow%20%C3%A9%20100%25")
    );
}

// A command it cannot serve (its payload is not JSON) is kept in its dead letters with
// the reason and answered, as agentsaga's receiver answers: `delivery_failed` to its
// `reply_to`, with the command's id and the reason, so that its saga moves on at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_it_cannot_serve_is_answered_delivery_failed() {
    let server = NatsServer::start();
    let (db, log) = dir().await;
    let mut bad = command("s1", false, &[]);
    bad.payload = "not json".into();
    publish(&server, &[bad.clone()]).await;
    let agent = PythonAgent::start_with(&server.url(), &db, &log, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, dead, [_, outbox, unpublished]) = python_db(&db).await;
        if dead.len() == 1 && outbox == 1 && unpublished == 0 {
            assert!(dead[0].contains("payload is not JSON"), "{dead:?}");
            break;
        }
        assert!(Instant::now() < deadline, "not answered: {dead:?} {outbox}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(agent.stop(&log).success());
    let got = replies(&server, 1).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let env = &got[0].1;
    assert_eq!(env.header("kind"), Some("delivery_failed"));
    assert_eq!(
        env.header("causation_id"),
        Some(bad.id.to_string().as_str())
    );
    let notice: serde_json::Value = serde_json::from_str(&env.payload).unwrap();
    assert_eq!(notice["message_id"], bad.id.to_string());
    assert!(
        notice["reason"]
            .as_str()
            .is_some_and(|r| r.contains("payload is not JSON")),
        "{notice}"
    );
}
