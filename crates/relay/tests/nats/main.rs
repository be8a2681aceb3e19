//! The NATS JetStream transport against a real `nats-server -js` (feature `nats`): a
//! throwaway server per test, on a free loopback port with its store in a temp dir.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agentsaga_core::{Envelope, MessageId};
use agentsaga_relay::nats::NatsTransport;
use agentsaga_relay::{Delivery, Transport};
use async_nats::jetstream;

/// A `nats-server -js` of one test, stopped and its store removed when dropped.
struct Server {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Server {
    fn start() -> Self {
        let bin = std::env::var("AGENTSAGA_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("agentsaga-nats-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the store dir");
        let child = Command::new(&bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("{bin} does not start ({e}): install the package nats-server")
            });
        let deadline = Instant::now() + Duration::from_secs(20);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, dir, port }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn envelope(destination: &str) -> Envelope {
    Envelope {
        seq: 7,
        id: MessageId::new(),
        destination: destination.to_owned(),
        key: Some("order-7".into()),
        payload: r#"{"amount":42}"#.into(),
        headers: [(
            "traceparent".to_owned(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
        )]
        .into_iter()
        .collect(),
        attempts: 1,
        created_at_ms: 1_700_000_000_000,
    }
}

/// The stream the tests publish to.
const STREAM: &str = "AGENTSAGA";

/// A transport to `server`, its stream made.
async fn with_stream(server: &Server) -> NatsTransport {
    let nats = NatsTransport::connect(&server.url()).await.unwrap();
    nats.ensure_stream(STREAM, Duration::from_secs(120))
        .await
        .unwrap();
    nats
}

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
