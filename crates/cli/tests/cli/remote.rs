//! `agentsaga remote --nats` (and `status --nats`) against a throwaway `nats-server -js`:
//! a consumer with messages undelivered and one in its service's hands, beside this
//! database's outbox rows for the same destination; a broker that cannot be reached.

use std::time::Duration;

use agentsaga_core::testing::{Backend, NatsServer, fresh_url};
use agentsaga_core::{Message, Store};
use agentsaga_relay::nats::{NatsConnect, NatsTransport};
use async_nats::jetstream;
use futures_util::StreamExt;
use serde_json::json;

use crate::common::{json, ok, run};

/// The stream as a runtime's link makes it, 4 messages for `payments` and one for
/// `mailer`, the consumer `payments_payments` holding one of its 4 unacknowledged and
/// `shop_mailer` with nothing taken.
async fn broker(server: &NatsServer) {
    let transport = NatsTransport::connect(&server.url()).await.unwrap();
    transport
        .ensure_stream("AGENTSAGA", Duration::from_secs(120))
        .await
        .unwrap();
    let js = jetstream::new(async_nats::connect(&server.url()).await.unwrap());
    for subject in ["payments", "payments", "payments", "payments", "mailer"] {
        js.publish(format!("agentsaga.{subject}"), "{}".into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let stream = js.get_stream("AGENTSAGA").await.unwrap();
    let durable = async |name: &str, subject: &str| {
        stream
            .create_consumer(jetstream::consumer::pull::Config {
                durable_name: Some(name.to_owned()),
                filter_subject: format!("agentsaga.{subject}"),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(600),
                ..Default::default()
            })
            .await
            .unwrap()
    };
    let payments = durable("payments_payments", "payments").await;
    durable("shop_mailer", "mailer").await;
    let mut taken = payments.fetch().max_messages(1).messages().await.unwrap();
    taken.next().await.expect("a message").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_shows_the_broker_lag_beside_the_outbox() {
    let server = NatsServer::start();
    broker(&server).await;
    let url = fresh_url(Backend::Sqlite).await;
    let store = Store::connect(&url).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    tx.enqueue_batch(&[
        Message::to("payments"),
        Message::to("payments"),
        Message::to("local"),
    ])
    .await
    .unwrap();
    tx.commit().await.unwrap();
    store.close().await;
    let nats = server.url();

    let doc = json(&url, &["remote", "--nats", &nats, "--json"]);
    let row = |consumer: &str, destination: &str, broker: [u64; 3], outbox: u64| {
        json!({
            "destination": destination, "consumer": consumer,
            "pending": broker[0], "ack_pending": broker[1], "redelivered": broker[2],
            "outbox_pending": outbox, "outbox_in_flight": 0,
            "outbox_unavailable": 0, "unavailable": null,
        })
    };
    assert_eq!(doc["error"], serde_json::Value::Null, "{doc}");
    assert_eq!(
        doc["destinations"],
        json!([
            row("shop_mailer", "mailer", [1, 0, 0], 0),
            row("payments_payments", "payments", [3, 1, 0], 2),
        ])
    );

    // The table: one line per consumer, its figures in the columns' order.
    let out = ok(&url, &["remote", "--nats", &nats]);
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        lines.contains(&vec![
            "payments",
            "payments_payments",
            "3",
            "1",
            "0",
            "2",
            "0",
            "0"
        ]),
        "{out}"
    );
    assert!(
        lines.contains(&vec!["mailer", "shop_mailer", "1", "0", "0", "0", "0", "0"]),
        "{out}"
    );

    // One service's consumers.
    let doc = json(
        &url,
        &["remote", "--nats", &nats, "--service", "shop", "--json"],
    );
    assert_eq!(
        doc["destinations"],
        json!([row("shop_mailer", "mailer", [1, 0, 0], 0)])
    );

    // `status` carries it too, and only given the broker.
    let status = json(&url, &["status", "--nats", &nats, "--json"]);
    assert_eq!(
        status["remote"]["destinations"][1]["pending"], 3,
        "{status}"
    );
    assert!(json(&url, &["status", "--json"]).get("remote").is_none());
    assert!(ok(&url, &["status", "--nats", &nats]).contains("payments_payments"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_said_and_the_status_still_answers() {
    let url = fresh_url(Backend::Sqlite).await;
    Store::connect(&url).await.unwrap().close().await;
    // Nothing listens on port 1 of the loopback.
    let nats = "nats://127.0.0.1:1";
    let r = run(&url, &["remote", "--nats", nats]);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stdout.contains("broker: nats://127.0.0.1:1"), "{r:?}");
    assert!(
        r.stderr
            .starts_with("error: the broker's figures are missing: unreachable: "),
        "{r:?}"
    );
    let status = json(&url, &["status", "--nats", nats, "--json"]);
    let error = status["remote"]["error"].as_str().unwrap();
    assert!(error.starts_with("unreachable: "), "{status}");
    assert_eq!(status["sagas_total"], 0);
    let r = run(&url, &["remote"]);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stderr.contains("--nats"), "{r:?}");
}

/// `agentsaga <args>` on `url` with `vars` set.
fn run_with(url: &str, args: &[&str], vars: &[(&str, &str)]) -> crate::common::Run {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_agentsaga"));
    cmd.env_remove("DATABASE_URL")
        .env_remove("AGENTSAGA_NATS")
        .envs(vars.iter().copied())
        .arg("--database-url")
        .arg(url)
        .args(args);
    crate::common::run_cmd(cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_broker_is_read_and_its_password_never_shown() {
    let server = NatsServer::start_with(&["--user", "ops", "--pass", "s3cret"]);
    let port = server.port();
    NatsTransport::connect(NatsConnect::new(&server.url()).user_password("ops", "s3cret"))
        .await
        .unwrap()
        .ensure_stream("AGENTSAGA", Duration::from_secs(120))
        .await
        .unwrap();
    let url = fresh_url(Backend::Sqlite).await;
    Store::connect(&url).await.unwrap().close().await;
    let no_secret = |r: &crate::common::Run| {
        assert!(
            !r.stdout.contains("s3cret") && !r.stderr.contains("s3cret"),
            "{r:?}"
        );
    };

    // In the URL, given or from AGENTSAGA_NATS.
    let nats = format!("nats://ops:s3cret@127.0.0.1:{port}");
    let r = run_with(&url, &["remote", "--nats", &nats], &[]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(
        r.stdout.contains("broker: nats://ops:***@127.0.0.1:"),
        "{r:?}"
    );
    no_secret(&r);
    for args in [
        &["remote", "--json"][..],
        &["status", "--json"],
        &["status"],
    ] {
        let r = run_with(&url, args, &[("AGENTSAGA_NATS", &nats)]);
        assert_eq!(r.code, Some(0), "{args:?}: {r:?}");
        assert!(r.stdout.contains("ops:***@127.0.0.1"), "{args:?}: {r:?}");
        no_secret(&r);
        if args.contains(&"--json") {
            let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
            let remote = doc.get("remote").unwrap_or(&doc);
            assert_eq!(remote["error"], serde_json::Value::Null, "{doc}");
        }
    }
    // `--help` shows no value of AGENTSAGA_NATS.
    let r = run_with(&url, &["--help"], &[("AGENTSAGA_NATS", &nats)]);
    no_secret(&r);

    // The user and password from the environment.
    let plain = server.url();
    let r = run_with(
        &url,
        &["remote", "--nats", &plain, "--json"],
        &[
            ("AGENTSAGA_NATS_USER", "ops"),
            ("AGENTSAGA_NATS_PASSWORD", "s3cret"),
        ],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    no_secret(&r);

    // Refused: said, and without the password.
    let wrong = format!("nats://ops:wr0ng-s3cret@127.0.0.1:{port}");
    let r = run_with(&url, &["remote", "--nats", &wrong], &[]);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stderr.contains("authorization violation"), "{r:?}");
    no_secret(&r);
}
