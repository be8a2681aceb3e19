//! A `.creds` file (user JWT and NKey seed) against a `nats-server` in operator mode:
//! an operator, an account with JetStream and a user, their JWTs signed here with
//! NKeys. With the file, A's relay publishes and B's receiver stores, end to end;
//! with another user's seed the server refuses, and the seed is never shown.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use nkeys::KeyPair;
use serde_json::{Value, json};

use agentsaga_relay::nats::NatsConnect;

use super::*;

/// A JWT of `claims` (`iss`, `sub` and `iat` added), signed by `issuer`.
fn jwt(issuer: &KeyPair, subject: &str, mut claims: Value) -> String {
    claims["iss"] = json!(issuer.public_key());
    claims["sub"] = json!(subject);
    claims["iat"] = json!(1_700_000_000);
    claims["jti"] = json!(MessageId::new().to_string().replace('-', "").to_uppercase());
    let head = URL_SAFE_NO_PAD.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{head}.{body}");
    let signature = URL_SAFE_NO_PAD.encode(issuer.sign(signed.as_bytes()).unwrap());
    format!("{signed}.{signature}")
}

/// A `.creds` file's text, as `nsc` writes it.
fn creds(user_jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credentials_file_reaches_a_broker_in_operator_mode() {
    let (operator, system, account, user) = (
        KeyPair::new_operator(),
        KeyPair::new_account(),
        KeyPair::new_account(),
        KeyPair::new_user(),
    );
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        json!({"name": "op", "nats": {
            "type": "operator", "version": 2, "system_account": system.public_key(),
        }}),
    );
    let unlimited = json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
    });
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        json!({"name": "app", "nats": {"limits": unlimited, "type": "account", "version": 2}}),
    );
    // JetStream needs the server's system account.
    let system_jwt = jwt(
        &operator,
        &system.public_key(),
        json!({"name": "SYS", "nats": {"type": "account", "version": 2}}),
    );
    let user_claims = json!({"name": "shop", "nats": {
        "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
        "type": "user", "version": 2,
    }});
    let user_jwt = jwt(&account, &user.public_key(), user_claims.clone());

    let dir = std::env::temp_dir().join(format!("agentsaga-creds-{}", MessageId::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("server.conf");
    std::fs::write(
        &config,
        format!(
            "operator: {operator_jwt}\nsystem_account: {sys}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {sys}: {system_jwt}\n  {}: {account_jwt}\n}}\n",
            account.public_key(),
            sys = system.public_key(),
        ),
    )
    .unwrap();
    let server = Server::start_with(&["-c", config.to_str().unwrap()]);

    let good = dir.join("shop.creds");
    std::fs::write(&good, creds(&user_jwt, &user.seed().unwrap())).unwrap();
    let to = NatsConnect::new(&server.url()).credentials_file(&good);
    let nats = NatsTransport::connect(&to)
        .await
        .expect("connect with the .creds");
    nats.ensure_stream(STREAM, Duration::from_secs(120))
        .await
        .unwrap();
    let (a, b) = (store().await, store().await);
    let relay = start_relay(&a, nats).await;
    let receiver = NatsReceiver::start(&to, b.clone(), receiver_config())
        .await
        .expect("start the receiver");
    let sent = enqueue(&a, 3, Some("k")).await;
    let ids: Vec<MessageId> = wait_rows(&b, 3).await.iter().map(|r| r.id).collect();
    assert_eq!(ids, sent.iter().map(|m| m.id).collect::<Vec<_>>());
    relay.shutdown().await;
    stop(receiver).await;

    // The user's JWT with another key's seed: the nonce's signature does not match.
    let other = KeyPair::new_user();
    let bad = dir.join("other.creds");
    let seed = other.seed().unwrap();
    std::fs::write(&bad, creds(&user_jwt, &seed)).unwrap();
    let e = NatsTransport::connect(NatsConnect::new(&server.url()).credentials_file(&bad))
        .await
        .expect_err("refused");
    let shown = format!("{e} {e:?}");
    assert!(matches!(e, NatsError::Connect { .. }), "{shown}");
    assert!(!shown.contains(&seed), "{shown}");
    let _ = std::fs::remove_dir_all(&dir);
}
