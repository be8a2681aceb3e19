//! `agentsaga mcp --nats URL`: the `status` tool with a secured broker, shown without
//! its password.

use serde_json::{Value, json};

use crate::common::prepare;
use crate::server::{Server, open};
use agentsaga_core::testing::Backend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_tool_shows_a_secured_broker_without_its_password() {
    use agentsaga_relay::nats::{NatsConnect, NatsTransport};
    let server =
        agentsaga_core::testing::NatsServer::start_with(&["--user", "ops", "--pass", "s3cret"]);
    NatsTransport::connect(NatsConnect::new(&server.url()).user_password("ops", "s3cret"))
        .await
        .unwrap()
        .ensure_stream("AGENTSAGA", std::time::Duration::from_secs(120))
        .await
        .unwrap();
    let p = prepare(Backend::Sqlite).await;
    let nats = format!("nats://ops:s3cret@127.0.0.1:{}", server.port());
    let mut mcp = Server::spawn_with(&p.url, &[], &["--nats", &nats]);
    open(&mut mcp);
    let result = mcp.call("status", json!({}));
    let shown = result.to_string();
    assert_eq!(result["isError"], false, "{shown}");
    let remote = &result["structuredContent"]["remote"];
    assert_eq!(remote["error"], Value::Null, "connected: {shown}");
    assert!(
        remote["broker"]
            .as_str()
            .unwrap()
            .starts_with("nats://ops:***@127.0.0.1:"),
        "{shown}"
    );
    assert!(!shown.contains("s3cret"), "{shown}");
}
