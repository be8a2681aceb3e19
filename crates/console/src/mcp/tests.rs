//! The tools in an in-memory session, with a runtime's engine.

use std::time::Duration;

use agentsaga_core::Store;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::{Engine, Saga, Step};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use rmcp::ServiceExt as _;
use serde_json::{Value, json};

use super::*;

/// A client's end of an in-memory MCP session: one request, its answer.
struct Client {
    lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    writer: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    next_id: u64,
}

impl Client {
    async fn send(&mut self, message: Value) {
        let line = format!("{message}\n");
        self.writer.write_all(line.as_bytes()).await.unwrap();
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let line = tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
                .await
                .expect("an answer in time")
                .unwrap()
                .expect("the session is open");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == json!(id) {
                return message["result"].clone();
            }
        }
    }

    async fn call(&mut self, name: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": arguments}))
            .await
    }
}

// Served with a runtime's engine, `start_saga` starts its sagas (under their key,
// once), and a name it does not host is not_found.
#[tokio::test]
async fn start_saga_with_an_engine() {
    let url = fresh_url(Backend::Sqlite).await;
    let store = Store::connect(&url).await.unwrap();
    let greet = Saga::<Value>::builder("greet", 1)
        .step(Step::new("hello", "greeter").nothing_to_undo())
        .build()
        .unwrap();
    let console = Console::new(store.clone()).with_engine(Engine::new([greet]).unwrap());
    let (client, server) = tokio::io::duplex(1 << 16);
    let session = tokio::spawn(async move {
        let running = McpServer::new(console)
            .allow([McpAction::Start])
            .serve(server)
            .await
            .unwrap();
        running.waiting().await.unwrap();
    });
    let (reader, writer) = tokio::io::split(client);
    let mut client = Client {
        lines: BufReader::new(reader).lines(),
        writer,
        next_id: 0,
    };
    let init = client
        .request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            }),
        )
        .await;
    let instructions = init["instructions"].as_str().unwrap();
    assert!(
        instructions.contains("start_saga can start: greet"),
        "{init}"
    );
    client
        .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;

    let args = json!({"name": "greet", "data": {"to": "ann"}, "key": "k-1"});
    let started = client.call("start_saga", args.clone()).await;
    assert_eq!(started["isError"], false, "{started}");
    let doc = &started["structuredContent"];
    assert_eq!(doc["saga"]["name"], "greet", "{started}");
    assert_eq!(doc["saga"]["state"], "running", "{started}");
    assert_eq!(doc["saga"]["key"], "k-1", "{started}");
    assert_eq!(doc["data"], json!({"to": "ann"}), "{started}");
    let again = client.call("start_saga", args).await;
    assert_eq!(
        again["structuredContent"]["saga"]["id"], doc["saga"]["id"],
        "the same key starts one saga: {again}"
    );
    let page = client.call("list_sagas", json!({})).await;
    assert_eq!(
        page["structuredContent"]["sagas"].as_array().unwrap().len(),
        1
    );

    let other = client
        .call("start_saga", json!({"name": "trip", "data": {}}))
        .await;
    assert_eq!(other["isError"], true, "{other}");
    let error = &other["structuredContent"]["error"];
    assert_eq!(error["kind"], "not_found", "{other}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("it hosts: greet"), "{message}");

    drop(client);
    tokio::time::timeout(Duration::from_secs(30), session)
        .await
        .expect("the session ends with its client")
        .unwrap();
    store.close().await;
}
