//! Remote destinations: the broker's figures from a fake [`RemoteSource`] joined with
//! this database's outbox rows, in order; `GET /api/v1/remote`, `status` and the page
//! carrying them; a broker that fails or hangs said in the document while the rest of
//! the status answers.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentsaga_console::Console;
use agentsaga_console::http::HttpConfig;
use agentsaga_console::ops::{BrokerConsumer, REMOTE_TIMEOUT, RemoteDoc, RemoteSource};
use agentsaga_core::testing::{self, Backend, fresh_url};
use agentsaga_core::{Message, Store};
use reqwest::StatusCode;

use crate::server::Api;

/// What the fake broker answers.
#[derive(Clone)]
enum Answer {
    Consumers(Vec<BrokerConsumer>),
    Fails(String),
    Hangs,
}

struct Fake(Mutex<Answer>);

#[async_trait::async_trait]
impl RemoteSource for Fake {
    fn describe(&self) -> String {
        "fake://broker, stream AGENTSAGA".into()
    }

    fn declared(&self) -> Vec<String> {
        vec!["payments".into(), "mailer".into()]
    }

    async fn consumers(&self) -> Result<Vec<BrokerConsumer>, String> {
        let answer = self.0.lock().unwrap().clone();
        match answer {
            Answer::Consumers(c) => Ok(c),
            Answer::Fails(why) => Err(why),
            Answer::Hangs => std::future::pending().await,
        }
    }
}

fn consumer(name: &str, destination: &str, figures: [u64; 3]) -> BrokerConsumer {
    BrokerConsumer {
        consumer: name.into(),
        destination: destination.into(),
        pending: figures[0],
        ack_pending: figures[1],
        redelivered: figures[2],
    }
}

fn row(
    destination: &str,
    consumer: Option<&str>,
    broker: Option<[u64; 3]>,
    outbox: [u64; 2],
) -> RemoteDoc {
    RemoteDoc {
        destination: destination.into(),
        consumer: consumer.map(str::to_owned),
        pending: broker.map(|b| b[0]),
        ack_pending: broker.map(|b| b[1]),
        redelivered: broker.map(|b| b[2]),
        outbox_pending: outbox[0],
        outbox_in_flight: outbox[1],
        outbox_unavailable: 0,
        unavailable: None,
    }
}

pub(crate) async fn remote_destinations_join_the_broker_and_the_outbox(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await)
        .await
        .expect("connect");
    let mut tx = store.begin().await.expect("begin");
    let messages: Vec<Message> = ["payments", "payments", "payments", "saga.order.v1", "local"]
        .into_iter()
        .map(Message::to)
        .collect();
    tx.enqueue_batch(&messages).await.expect("enqueue");
    tx.commit().await.expect("commit");
    assert_eq!(
        testing::claim(&store, &["payments".into()], 1).await.len(),
        1
    );

    // Without a source: no `remote` in the status, and no route to it.
    let plain = Console::new(store.clone());
    assert!(!plain.has_remote());
    let api = Api::console(&plain, HttpConfig::default()).await;
    let (code, status) = api.get("/api/v1/status").await;
    assert_eq!(code, StatusCode::OK);
    assert!(status.get("remote").is_none(), "{status}");
    assert_eq!(api.get("/api/v1/remote").await.0, StatusCode::NOT_FOUND);

    let fake = Arc::new(Fake(Mutex::new(Answer::Consumers(vec![
        consumer("shop_saga_order_v1", "saga.order.v1", [1, 0, 0]),
        consumer("python-payments", "payments", [0, 0, 0]),
        consumer("payments_payments", "payments", [5, 2, 1]),
    ]))));
    let console = Console::new(store.clone()).with_remote(fake.clone());
    let doc = console.remote().await.expect("remote");
    assert_eq!(doc.broker, "fake://broker, stream AGENTSAGA");
    assert_eq!(doc.error, None);
    assert_eq!(
        doc.destinations,
        [
            row("mailer", None, None, [0, 0]),
            row(
                "payments",
                Some("payments_payments"),
                Some([5, 2, 1]),
                [2, 1]
            ),
            row("payments", Some("python-payments"), Some([0, 0, 0]), [2, 1]),
            row(
                "saga.order.v1",
                Some("shop_saga_order_v1"),
                Some([1, 0, 0]),
                [1, 0]
            ),
        ]
    );
    assert_eq!(
        console.status().await.expect("status").remote,
        Some(doc.clone())
    );
    let api = Api::console(&console, HttpConfig::default()).await;
    let (code, body) = api.get("/api/v1/remote").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(body, serde_json::to_value(&doc).unwrap());
    let (_, status) = api.get("/api/v1/status").await;
    assert_eq!(status["remote"], body);
    let page = api.request(reqwest::Method::GET, "/").send().await.unwrap();
    let page = page.text().await.unwrap();
    assert!(page.contains("<h2>Remote destinations</h2>"), "{page}");
    assert!(
        page.contains("<td class=\"mono\">payments_payments</td>"),
        "{page}"
    );

    // A broker that refuses: said, and this database's figures for what is declared.
    *fake.0.lock().unwrap() = Answer::Fails("connection refused".into());
    let status = console
        .status()
        .await
        .expect("the status answers all the same");
    let doc = status.remote.expect("remote");
    assert_eq!(
        doc.error.as_deref(),
        Some("unreachable: connection refused")
    );
    assert_eq!(
        doc.destinations,
        [
            row("mailer", None, None, [0, 0]),
            row("payments", None, None, [2, 1])
        ]
    );
    assert_eq!(status.outbox.pending, 4);
    let page = api.request(reqwest::Method::GET, "/").send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("id=\"remote-error\""));

    // A broker that does not answer: bounded.
    *fake.0.lock().unwrap() = Answer::Hangs;
    let t = Instant::now();
    let (code, status) = api.get("/api/v1/status").await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        t.elapsed() < REMOTE_TIMEOUT + Duration::from_secs(3),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(
        status["remote"]["error"],
        "unreachable: no answer within 2s"
    );
    assert_eq!(status["outbox"]["in_flight"], 1);
}
