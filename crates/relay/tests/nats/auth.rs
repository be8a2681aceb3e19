//! A secured broker: a `nats-server` started with a user and password, with a token,
//! and with TLS (a CA and certificates this test makes with `rcgen`). With the right
//! credentials A's relay publishes and B's receiver stores, end to end; wrong or
//! missing ones give [`NatsError::Connect`] naming the broker, its secret redacted.

use std::path::{Path, PathBuf};

use agentsaga_relay::nats::NatsConnect;

use super::*;

const PASSWORD: &str = "s3cret-pass";
const TOKEN: &str = "s3cret-token";

/// A relay on a fresh store A publishing through `to`, a receiver on a fresh store B
/// consuming through `to`: 3 messages sent from A land in B.
async fn end_to_end(to: &NatsConnect) {
    let nats = NatsTransport::connect(to)
        .await
        .expect("connect the transport");
    nats.ensure_stream(STREAM, Duration::from_secs(120))
        .await
        .unwrap();
    let (a, b) = (store().await, store().await);
    let relay = start_relay(&a, nats).await;
    let receiver = NatsReceiver::start(to, b.clone(), receiver_config())
        .await
        .expect("start the receiver");
    let sent = enqueue(&a, 3, Some("k")).await;
    let rows = wait_rows(&b, 3).await;
    let ids: Vec<MessageId> = rows.iter().map(|r| r.id).collect();
    assert_eq!(ids, sent.iter().map(|m| m.id).collect::<Vec<_>>());
    relay.shutdown().await;
    stop(receiver).await;
}

/// The error of connecting through `to`, which must fail.
async fn refused(to: impl Into<NatsConnect>) -> String {
    match NatsTransport::connect(to).await {
        Ok(_) => panic!("connected without the right credentials"),
        Err(e @ NatsError::Connect { .. }) => e.to_string(),
        Err(e) => panic!("not a connect error: {e:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_and_password_in_the_url_reach_a_secured_broker() {
    let server = Server::start_with(&["--user", "ops", "--pass", PASSWORD]);
    let port = server.port();
    let url = format!("nats://ops:{PASSWORD}@127.0.0.1:{port}");
    end_to_end(&NatsConnect::new(&url)).await;
    // Given beside the URL.
    end_to_end(&NatsConnect::new(&server.url()).user_password("ops", PASSWORD)).await;

    for (to, what) in [
        (
            NatsConnect::new(&format!("nats://ops:wrong-pass@127.0.0.1:{port}")),
            "nats://ops:***@127.0.0.1",
        ),
        (NatsConnect::new(&server.url()), "nats://127.0.0.1"),
    ] {
        let e = refused(to).await;
        assert!(e.contains(what), "{e}");
        assert!(e.contains("authorization violation"), "{e}");
        assert!(!e.contains("wrong-pass") && !e.contains(PASSWORD), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_reaches_a_broker_that_asks_for_one() {
    let server = Server::start_with(&["--auth", TOKEN]);
    let port = server.port();
    end_to_end(&NatsConnect::new(&server.url()).token(TOKEN)).await;
    end_to_end(&NatsConnect::new(&format!(
        "nats://{TOKEN}@127.0.0.1:{port}"
    )))
    .await;

    let e = refused(format!("nats://wrong-token@127.0.0.1:{port}")).await;
    assert!(e.contains("nats://***@127.0.0.1"), "{e}");
    assert!(e.contains("authorization violation"), "{e}");
    assert!(!e.contains("wrong-token"), "{e}");
    let e = refused(&server.url()).await;
    assert!(e.contains("authorization violation"), "{e}");
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate it signed, as PEM
/// files in a fresh directory: `ca.pem`, `server.pem`, `server-key.pem`,
/// `client.pem`, `client-key.pem`.
fn certificates() -> PathBuf {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let dir = std::env::temp_dir().join(format!("agentsaga-tls-{}", MessageId::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, pem: String| std::fs::write(dir.join(name), pem).unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    write("ca.pem", issuer.pem());
    for (name, san) in [("server", "127.0.0.1"), ("client", "client")] {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![san.to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        write(&format!("{name}.pem"), cert.pem());
        write(&format!("{name}-key.pem"), key.serialize_pem());
    }
    dir
}

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).to_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_operators_ca_and_a_client_certificate() {
    let dir = certificates();
    let p = |name| path(&dir, name);
    let server = Server::start_with(&[
        "--tlsverify",
        "--tlscert",
        &p("server.pem"),
        "--tlskey",
        &p("server-key.pem"),
        "--tlscacert",
        &p("ca.pem"),
        "--user",
        "ops",
        "--pass",
        PASSWORD,
    ]);
    let port = server.port();
    let url = format!("tls://ops:{PASSWORD}@127.0.0.1:{port}");
    let to = NatsConnect::new(&url)
        .ca(p("ca.pem"))
        .client_cert(p("client.pem"), p("client-key.pem"));
    end_to_end(&to).await;

    // Without the CA the server's certificate is not trusted; without the client's,
    // the server refuses the handshake.
    let e = refused(NatsConnect::new(&url).client_cert(p("client.pem"), p("client-key.pem"))).await;
    assert!(e.contains("tls://ops:***@127.0.0.1"), "{e}");
    let e = refused(NatsConnect::new(&url).ca(p("ca.pem"))).await;
    assert!(!e.contains(PASSWORD), "{e}");

    // A file that is not there is named, and nothing is dialled.
    let missing = NatsTransport::connect(NatsConnect::new(&url).ca(p("nowhere.pem"))).await;
    assert!(
        matches!(
            &missing,
            Err(NatsError::Credentials {
                what: "CA file",
                ..
            })
        ),
        "{missing:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_credentials_file_that_is_none_is_named_not_shown() {
    let dir = std::env::temp_dir().join(format!("agentsaga-creds-{}", MessageId::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let creds = dir.join("app.creds");
    std::fs::write(&creds, "not a creds file: s3cret-seed").unwrap();
    let e = NatsTransport::connect(NatsConnect::new("nats://127.0.0.1:1").credentials_file(&creds))
        .await
        .expect_err("no credentials in it");
    assert!(
        matches!(
            &e,
            NatsError::Credentials {
                what: "credentials file",
                ..
            }
        ),
        "{e:?}"
    );
    let shown = e.to_string();
    assert!(
        shown.contains("app.creds") && !shown.contains("s3cret"),
        "{shown}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
