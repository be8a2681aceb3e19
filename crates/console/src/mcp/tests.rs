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

/// A session with the tools over `console`, `allow`ed those actions, past the
/// handshake: the client, the server's task, and the `initialize` answer.
async fn open(
    console: Console,
    allow: impl IntoIterator<Item = McpAction> + Send + 'static,
) -> (Client, tokio::task::JoinHandle<()>, Value) {
    let (client, server) = tokio::io::duplex(1 << 16);
    let session = tokio::spawn(async move {
        let running = McpServer::new(console)
            .allow(allow)
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
    client
        .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    (client, session, init)
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
    let (mut client, session, init) = open(console, [McpAction::Start]).await;
    let instructions = init["instructions"].as_str().unwrap();
    assert!(
        instructions.contains("start_saga can start: greet"),
        "{init}"
    );

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

// `show_saga` shows what a saga and its steps used and its budget; yet with every
// action allowed, no tool raises a budget: that is a person's act (an LLM must not
// lift its own limit), so the tools are exactly the known ones and none takes a limit.
// Nor does any write a schedule: `list_schedules` only reads them; nor resume a saga
// (`pause_saga` pauses one; letting it go on is a person's decision); nor rewind one
// (no tool, no `--allow` for it: a rewind is a person's act).
#[tokio::test]
async fn usage_shows_and_no_tool_raises_a_budget() {
    use agentsaga_saga::testing::{capped, quick_engine, waiting_for_raise};

    let url = fresh_url(Backend::Sqlite).await;
    let store = Store::connect(&url).await.unwrap();
    let engine = quick_engine([capped()]);
    let id = waiting_for_raise(&store, &engine).await;
    let console = Console::new(store.clone()).with_engine(engine);
    let (mut client, session, _) = open(console, McpAction::ALL).await;

    let list = client.request("tools/list", json!({})).await;
    let mut names: Vec<&str> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "abort_saga",
            "list_dead_letters",
            "list_sagas",
            "list_schedules",
            "pause_saga",
            "redrive_dead_letter",
            "show_saga",
            "signal_saga",
            "start_saga",
            "status",
        ],
        "{list}"
    );
    for tool in list["tools"].as_array().unwrap() {
        let arguments = tool["inputSchema"].to_string();
        for word in ["budget", "tokens_out", "cost_micros"] {
            assert!(!arguments.contains(word), "{word} in {tool}");
        }
    }
    let call = client
        .call(
            "raise_budget",
            json!({"id": id.to_string(), "tokens_out": 1000}),
        )
        .await;
    assert_ne!(call["isError"], false, "no such tool: {call}");
    assert!(!names.iter().any(|n| n.contains("rewind")), "{list}");
    assert!("rewind".parse::<McpAction>().is_err());
    let call = client
        .call(
            "rewind_saga",
            json!({"id": id.to_string(), "to": "reserve", "reason": "x"}),
        )
        .await;
    assert_ne!(call["isError"], false, "no such tool: {call}");

    let shown = client
        .call("show_saga", json!({"id": id.to_string()}))
        .await;
    let spending = &shown["structuredContent"]["spending"];
    assert_eq!(
        spending["usage"],
        json!({"tokens_in": 30, "tokens_out": 100})
    );
    assert_eq!(spending["budget"], json!({"tokens_out": 100}), "{shown}");
    assert_eq!(spending["waiting_for_raise"], true, "{shown}");
    assert_eq!(
        shown["structuredContent"]["steps"][0]["usage"],
        json!({"tokens_in": 30, "tokens_out": 100}),
        "{shown}"
    );

    drop(client);
    tokio::time::timeout(Duration::from_secs(30), session)
        .await
        .expect("the session ends with its client")
        .unwrap();
    let after = agentsaga_saga::query::spending(&store, id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        after.budget,
        Some(agentsaga_saga::Budget::new().tokens_out(100))
    );
    store.close().await;
}

// A read-only session (no action allowed) lists the sagas parked at a sleep
// (`sleeping`), with when each wakes, and `show_saga` gives the sleep step's time.
#[tokio::test]
async fn a_read_only_session_lists_the_sleeping_sagas() {
    let url = fresh_url(Backend::Sqlite).await;
    let store = Store::connect(&url).await.unwrap();
    let def = Saga::<Value>::builder("napper", 1)
        .step(Step::sleep("nap", Duration::from_secs(3600)))
        .pivot(Step::new("after", "nowhere"))
        .build()
        .unwrap();
    let engine = Engine::new([def]).unwrap();
    let mut tx = store.begin().await.unwrap();
    let id = engine.start(&mut tx, "napper", &json!({})).await.unwrap();
    tx.commit().await.unwrap();
    let (mut client, session, _) = open(Console::new(store.clone()), []).await;

    let page = client.call("list_sagas", json!({"sleeping": true})).await;
    assert_eq!(page["isError"], false, "{page}");
    let sagas = page["structuredContent"]["sagas"].as_array().unwrap();
    assert_eq!(sagas.len(), 1, "{page}");
    assert_eq!(sagas[0]["id"], json!(id.to_string()));
    let until = sagas[0]["sleeping_until_ms"]
        .as_i64()
        .expect("when it wakes");
    let waiting = client.call("list_sagas", json!({"waiting": true})).await;
    assert_eq!(
        waiting["structuredContent"]["sagas"],
        json!([]),
        "{waiting}"
    );
    let shown = client
        .call("show_saga", json!({"id": id.to_string()}))
        .await;
    let step = &shown["structuredContent"]["steps"][0];
    assert_eq!(step["destination"], "sleep:nap", "{shown}");
    assert_eq!(step["wakes_at_ms"], json!(until), "{shown}");

    drop(client);
    tokio::time::timeout(Duration::from_secs(30), session)
        .await
        .expect("the session ends with its client")
        .unwrap();
    store.close().await;
}

// A read-only session lists the schedules: each the same document as the API's, its
// calendar, next due time and counts; no tool writes one.
#[tokio::test]
async fn a_read_only_session_lists_the_schedules() {
    use agentsaga_saga::schedule::{self, Schedule};

    let url = fresh_url(Backend::Sqlite).await;
    let store = Store::connect(&url).await.unwrap();
    let brief = Schedule::new("morning-brief", "research", "0 7 * * MON-FRI")
        .time_zone("Europe/Paris")
        .input(json!({"topic": "news"}));
    schedule::create(&store, &brief).await.unwrap();
    let console = Console::new(store.clone());
    let want = serde_json::to_value(console.schedules().await.unwrap()).unwrap();
    let (mut client, session, init) = open(console, []).await;
    assert!(
        init["instructions"]
            .as_str()
            .unwrap()
            .contains("list_schedules"),
        "{init}"
    );
    let list = client.request("tools/list", json!({})).await;
    let tool = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "list_schedules")
        .expect("listed read-only");
    assert_eq!(tool["annotations"]["readOnlyHint"], true, "{tool}");

    let got = client.call("list_schedules", json!({})).await;
    assert_eq!(got["isError"], false, "{got}");
    assert_eq!(got["structuredContent"], want);
    let s = &got["structuredContent"]["schedules"][0];
    assert_eq!(s["name"], "morning-brief", "{got}");
    assert_eq!(s["saga"], "research");
    assert_eq!(s["cron"], "0 7 * * MON-FRI");
    assert_eq!(s["time_zone"], "Europe/Paris");
    assert_eq!(s["input"], json!({"topic": "news"}));
    assert_eq!(s["paused"], false);
    assert!(
        s["next_due_ms"].is_i64() && s["next_due"].is_string(),
        "{s}"
    );
    let bad = client.call("list_schedules", json!({"name": "x"})).await;
    assert_eq!(
        bad["structuredContent"]["error"]["kind"], "invalid",
        "{bad}"
    );
    for write in ["create_schedule", "pause_schedule", "delete_schedule"] {
        let call = client.call(write, json!({"name": "morning-brief"})).await;
        assert_ne!(call["isError"], false, "no such tool: {call}");
    }

    drop(client);
    tokio::time::timeout(Duration::from_secs(30), session)
        .await
        .expect("the session ends with its client")
        .unwrap();
    let still = schedule::get(&store, "morning-brief")
        .await
        .unwrap()
        .unwrap();
    assert!(!still.schedule.paused);
    store.close().await;
}
