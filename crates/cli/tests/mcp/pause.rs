//! `pause_saga`: allowed on its own (`--allow pause`), it pauses a saga as `mcp` with
//! the reason it is given; no tool resumes one, whatever is allowed: a person does.

use agentsaga_core::Store;
use agentsaga_core::testing::Backend;
use agentsaga_saga::Engine;
use serde_json::{Value, json};

use crate::common::{self, json, prepare};
use crate::fixture::{add_sagas, everything, mail};
use crate::server::{Server, open};

// Without `pause` allowed, `pause_saga` is forbidden (nothing done); allowed, it pauses
// a running saga (by `mcp`, its reason shown as the CLI shows it), refuses a finished
// or a paused one and an empty reason; `resume_saga` exists under no `--allow`, and
// the person's path (the CLI) resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_pauses_but_never_resumes() {
    let p = prepare(Backend::Sqlite).await;
    let url = p.url.as_str();
    let store = Store::connect(url).await.unwrap();
    let engine = Engine::new([common::trip(), mail()]).unwrap();
    let extra = add_sagas(&store, &engine).await;
    let running = extra.running.to_string();
    let pause = json!({"id": running, "reason": "the drafts look wrong"});
    let before = everything(url);

    let mut mcp = Server::spawn(url, &["start", "signal", "abort", "redrive"]);
    open(&mut mcp);
    let (kind, message) = mcp.error("pause_saga", pause.clone());
    assert_eq!(kind, "forbidden", "{message}");
    assert!(message.contains("--allow pause"), "{message}");
    mcp.finish();
    assert_eq!(everything(url), before, "nothing was done");

    let mut mcp = Server::spawn(url, &["pause"]);
    let init = open(&mut mcp);
    let instructions = init["instructions"].as_str().unwrap_or_default();
    assert!(instructions.contains("pause_saga"), "{init}");
    assert!(
        instructions.contains("a paused saga is resumed by a person"),
        "{init}"
    );
    let list = mcp.request("tools/list", json!({})).expect("tools/list");
    let tool = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "pause_saga")
        .expect("listed once allowed")
        .clone();
    assert_eq!(
        tool["inputSchema"]["required"],
        json!(["id", "reason"]),
        "{tool}"
    );
    assert_eq!(tool["annotations"]["readOnlyHint"], false, "{tool}");
    let names: Vec<&str> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(!names.iter().any(|n| n.contains("resume")), "{names:?}");
    for args in [
        json!({"id": running, "reason": ""}),
        json!({"id": running, "reason": " "}),
        json!({"id": running}),
        json!({"id": running, "reason": "x", "by": "someone"}),
        json!({"id": "42", "reason": "x"}),
    ] {
        let (kind, message) = mcp.error("pause_saga", args.clone());
        assert_eq!(kind, "invalid", "{args}: {message}");
    }
    let (kind, message) = mcp.error(
        "pause_saga",
        json!({"id": p.completed.to_string(), "reason": "x"}),
    );
    assert_eq!(kind, "refused", "{message}");
    assert_eq!(everything(url), before, "nothing was done");

    let paused = mcp.doc("pause_saga", pause.clone());
    assert_eq!(paused, json(url, &["sagas", "show", &running, "--json"]));
    let by = &paused["saga"]["paused"];
    assert_eq!(by["by"], "mcp", "{paused}");
    assert_eq!(by["reason"], "the drafts look wrong", "{paused}");
    let (kind, message) = mcp.error("pause_saga", pause);
    assert_eq!(kind, "refused", "{message}");
    assert!(message.contains("paused already"), "{message}");
    for tool in ["resume_saga", "unpause_saga"] {
        let e = mcp
            .request(
                "tools/call",
                json!({"name": tool, "arguments": {"id": running}}),
            )
            .expect_err("no such tool");
        assert!(e["code"].is_i64(), "{e}");
    }
    mcp.finish();
    let line = common::fails(url, &["mcp", "--allow", "pause,resume"]);
    assert!(line.contains("unknown action `resume`"), "{line}");
    let shown = json(url, &["sagas", "show", &running, "--json"]);
    assert_eq!(shown["saga"]["paused"]["by"], "mcp", "still paused");

    // A person resumes it.
    let out = common::ok(url, &["sagas", "resume", &running]);
    assert!(out.contains("resumed saga"), "{out}");
    let shown = json(url, &["sagas", "show", &running, "--json"]);
    assert_eq!(shown["saga"]["paused"], Value::Null);
    store.close().await;
}
