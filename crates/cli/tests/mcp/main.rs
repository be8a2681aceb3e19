//! `agentsaga mcp` as an MCP client sees it: the binary spawned against a SQLite
//! database prepared by the saga engine, spoken to in newline-delimited JSON-RPC over
//! its stdin and stdout (`initialize`, `notifications/initialized`, `tools/list`,
//! `tools/call` of every tool). Its documents are the CLI's `--json` ones; its errors
//! name the API's kinds.

//!
//! The session (`server.rs`) and the sagas acted on (`fixture.rs`) are modules of their
//! own; the tests are here, but for the pause's (`pause.rs`) and the broker's
//! (`remote.rs`).

#[path = "../common/mod.rs"]
mod common;
mod fixture;
mod pause;
mod remote;
mod server;

use std::process::{Command, Stdio};

use agentsaga_core::Store;
use agentsaga_core::testing::Backend;
use agentsaga_saga::{Engine, SagaState, query};
use serde_json::{Value, json};

use common::{json, prepare};
use fixture::{add_sagas, everything, mail, transfer};
use server::{Server, open};

const TOOLS: [&str; 10] = [
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
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_lists_shows_and_acts() {
    let p = prepare(Backend::Sqlite).await;
    let url = p.url.as_str();
    let store = Store::connect(url).await.unwrap();
    let engine = Engine::new([common::trip(), mail()]).unwrap();
    let extra = add_sagas(&store, &engine).await;
    let (waiting, running) = (extra.waiting.to_string(), extra.running.to_string());
    let stuck = p.stuck[0].to_string();

    let mut mcp = Server::spawn(url, &["start", "signal", "abort", "pause", "redrive"]);

    // The handshake.
    let init = open(&mut mcp);
    assert_eq!(init["protocolVersion"], "2025-06-18", "{init}");
    assert_eq!(init["serverInfo"]["name"], "agentsaga", "{init}");
    assert!(init["capabilities"]["tools"].is_object(), "{init}");
    let instructions = init["instructions"].as_str().unwrap_or_default();
    assert!(instructions.contains("no saga definitions"), "{init}");

    // Every tool, each with a description and an object schema for its arguments.
    let list = mcp.request("tools/list", json!({})).expect("tools/list");
    let tools = list["tools"].as_array().expect("tools");
    let mut names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, TOOLS, "{list}");
    for tool in tools {
        let schema = &tool["inputSchema"];
        assert_eq!(schema["type"], "object", "{tool}");
        assert!(schema["properties"].is_object(), "{tool}");
        assert!(
            tool["description"].as_str().unwrap_or_default().len() > 40,
            "{tool}"
        );
    }
    let tool = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap().clone();
    assert_eq!(
        tool("show_saga")["inputSchema"]["required"],
        json!(["id"]),
        "{list}"
    );
    let signal_props = &tool("signal_saga")["inputSchema"]["properties"];
    for arg in ["id", "name", "data", "reject"] {
        assert!(signal_props.get(arg).is_some(), "signal_saga lacks {arg}");
    }
    let list_props = &tool("list_sagas")["inputSchema"]["properties"];
    for arg in [
        "state", "name", "key", "waiting", "sleeping", "stalled", "cursor", "limit", "parent",
    ] {
        assert!(list_props.get(arg).is_some(), "list_sagas lacks {arg}");
    }
    assert_eq!(
        tool("list_sagas")["inputSchema"]["additionalProperties"],
        false
    );
    assert_eq!(tool("status")["annotations"]["readOnlyHint"], true);
    assert!(
        tool("start_saga")["description"]
            .as_str()
            .unwrap()
            .contains("not_found"),
        "start_saga says where it cannot start"
    );

    // Reads: the CLI's documents.
    let status = mcp.doc("status", json!({}));
    // The same but for the relay's lag, which grows by the time the CLI reads it.
    let mut cli_status = json(url, &["status", "--json"]);
    let mut mcp_status = status.clone();
    for s in [&mut cli_status, &mut mcp_status] {
        s["outbox"]["oldest_pending_age_ms"] = Value::Null;
    }
    assert_eq!(mcp_status, cli_status);
    assert_eq!(status["sagas"]["stuck"], 3, "{status}");
    assert_eq!(status["dead_letters"], 3, "{status}");

    let all = mcp.doc("list_sagas", json!({}));
    assert_eq!(all, json(url, &["sagas", "list", "--json"]));
    assert_eq!(all["sagas"].as_array().unwrap().len(), 8, "{all}");
    let stuck_page = mcp.doc("list_sagas", json!({"state": "stuck"}));
    assert_eq!(
        stuck_page,
        json(url, &["sagas", "list", "--state", "stuck", "--json"])
    );
    assert_eq!(stuck_page["sagas"].as_array().unwrap().len(), 3);
    let waiting_page = mcp.doc("list_sagas", json!({"waiting": true}));
    assert_eq!(
        waiting_page,
        json(url, &["sagas", "list", "--waiting", "--json"])
    );
    assert_eq!(waiting_page["sagas"][0]["id"], waiting.as_str());
    assert_eq!(waiting_page["sagas"][0]["waiting_for"], "approval");
    // No saga here has children: the filter by parent answers an empty page, as the
    // CLI's does.
    let children = mcp.doc("list_sagas", json!({"parent": waiting}));
    assert_eq!(
        children,
        json(
            url,
            &["sagas", "list", "--parent", waiting.as_str(), "--json"]
        )
    );
    assert_eq!(children["sagas"].as_array().unwrap().len(), 0, "{children}");
    let keyed = mcp.doc("list_sagas", json!({"key": "req-ok", "name": "trip"}));
    assert_eq!(keyed["sagas"][0]["id"], p.completed.to_string().as_str());
    // Pages by cursor, as the CLI does.
    let first = mcp.doc("list_sagas", json!({"limit": 3}));
    assert_eq!(
        first,
        json(url, &["sagas", "list", "--limit", "3", "--json"])
    );
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let second = mcp.doc("list_sagas", json!({"limit": 3, "cursor": cursor}));
    assert_eq!(
        second,
        json(
            url,
            &[
                "sagas", "list", "--limit", "3", "--cursor", &cursor, "--json"
            ]
        )
    );
    assert_eq!(second["sagas"][0], all["sagas"][3]);

    let shown = mcp.doc("show_saga", json!({"id": stuck}));
    assert_eq!(shown, json(url, &["sagas", "show", &stuck, "--json"]));
    assert_eq!(shown["saga"]["state"], "stuck");
    assert_eq!(shown["steps"][0]["compensation_state"], "failed", "{shown}");

    let dead = mcp.doc("list_dead_letters", json!({}));
    assert_eq!(dead, json(url, &["dead", "list", "--json"]));
    assert_eq!(dead["dead_letters"].as_array().unwrap().len(), 3, "{dead}");
    let mailer = mcp.doc("list_dead_letters", json!({"destination": "mailer"}));
    assert_eq!(
        mailer["dead_letters"][0]["id"],
        p.dead_mailer.to_string().as_str()
    );

    // Errors: the API's kinds, nothing done.
    let unknown = "0190f0f0-0000-7000-8000-000000000000";
    let (kind, message) = mcp.error("show_saga", json!({"id": unknown}));
    assert_eq!(kind, "not_found", "{message}");
    assert!(message.contains(unknown), "{message}");
    let (kind, message) = mcp.error("show_saga", json!({"id": "not-a-uuid"}));
    assert_eq!(kind, "invalid", "{message}");
    assert!(message.contains("malformed saga id"), "{message}");
    let (kind, message) = mcp.error("abort_saga", json!({"id": "42"}));
    assert_eq!(kind, "invalid", "{message}");
    let (kind, message) = mcp.error("show_saga", json!({}));
    assert_eq!(kind, "invalid", "{message}");
    assert!(message.contains("missing field `id`"), "{message}");
    let (kind, message) = mcp.error("list_sagas", json!({"state": "sleeping"}));
    assert_eq!(kind, "invalid", "{message}");
    assert!(message.contains("unknown saga state"), "{message}");
    let (kind, message) = mcp.error("list_sagas", json!({"limt": 3}));
    assert_eq!(kind, "invalid", "an unknown filter: {message}");
    let (kind, message) = mcp.error("list_sagas", json!({"limit": 5000}));
    assert_eq!(kind, "invalid", "{message}");
    let (kind, message) = mcp.error("list_sagas", json!({"cursor": "nonsense"}));
    assert_eq!(kind, "invalid", "{message}");
    let (kind, message) = mcp.error("redrive_dead_letter", json!({"id": "x"}));
    assert_eq!(kind, "invalid", "{message}");
    assert!(message.contains("malformed message id"), "{message}");
    let (kind, message) = mcp.error("redrive_dead_letter", json!({"id": unknown}));
    assert_eq!(kind, "not_found", "{message}");
    let e = mcp
        .request(
            "tools/call",
            json!({"name": "drop_tables", "arguments": {}}),
        )
        .expect_err("an unknown tool is a protocol error");
    assert!(e["code"].is_i64(), "{e}");

    // start_saga: this process hosts no definitions.
    let (kind, message) = mcp.error(
        "start_saga",
        json!({"name": "trip", "data": {"case": "ok"}, "key": "k-1"}),
    );
    assert_eq!(kind, "not_found", "{message}");
    assert!(message.contains("hosts no saga named `trip`"), "{message}");

    // abort_saga: a running saga compensates (before anything is pumped again); a
    // finished one is refused.
    let before = query::get(&store, extra.running).await.unwrap().unwrap();
    assert_eq!(before.state, SagaState::Running);
    let aborted = mcp.doc("abort_saga", json!({"id": running}));
    assert_eq!(aborted["saga"]["state"], "compensating", "{aborted}");
    assert_eq!(aborted, json(url, &["sagas", "show", &running, "--json"]));
    let after = query::get(&store, extra.running).await.unwrap().unwrap();
    assert_eq!(after.state, SagaState::Compensating);
    let (kind, message) = mcp.error("abort_saga", json!({"id": p.completed.to_string()}));
    assert_eq!(kind, "refused", "{message}");
    assert_eq!(
        query::get(&store, p.completed)
            .await
            .unwrap()
            .unwrap()
            .state,
        SagaState::Completed,
        "a refused action changes nothing"
    );

    // signal_saga reaches the waiting saga; a second one is a duplicate.
    let (kind, message) = mcp.error(
        "signal_saga",
        json!({"id": waiting, "name": "approval", "data": 1, "reject": "no"}),
    );
    assert_eq!(kind, "invalid", "{message}");
    let (kind, message) = mcp.error("signal_saga", json!({"id": waiting, "name": "payment"}));
    assert_eq!(kind, "refused", "{message}");
    assert!(message.contains("never waits for `payment`"), "{message}");
    let sent = mcp.doc(
        "signal_saga",
        json!({"id": waiting, "name": "approval", "data": {"by": "mcp"}}),
    );
    assert_eq!(sent["receipt"], "recorded", "{sent}");
    assert_eq!(sent["saga"]["id"], waiting.as_str(), "{sent}");
    assert!(sent["steps"].is_array(), "the saga's document: {sent}");
    let again = mcp.doc(
        "signal_saga",
        json!({"id": waiting, "name": "approval", "reject": "too late"}),
    );
    assert_eq!(again["receipt"], "duplicate", "{again}");
    common::pump(&store, &engine, &[extra.waiting]).await;
    let done = mcp.doc("show_saga", json!({"id": waiting}));
    assert_eq!(done["saga"]["state"], "completed", "{done}");
    assert_eq!(done["data"]["approved"], json!({"by": "mcp"}), "{done}");
    let (kind, message) = mcp.error("signal_saga", json!({"id": waiting, "name": "approval"}));
    assert_eq!(kind, "refused", "{message}");

    // redrive_dead_letter: a moot one is refused (still dead), forced it is purged;
    // one that is not moot is pending again.
    let moot = extra.moot.to_string();
    let (kind, message) = mcp.error("redrive_dead_letter", json!({"id": moot}));
    assert_eq!(kind, "refused", "{message}");
    assert!(message.contains("refused to re-drive"), "{message}");
    assert_eq!(json(url, &["status", "--json"])["outbox"]["dead"], 3);
    let purged = mcp.doc("redrive_dead_letter", json!({"id": moot, "force": true}));
    assert_eq!(purged["outcome"], "purged", "{purged}");
    assert!(purged["moot"].is_string(), "{purged}");
    let mailer = p.dead_mailer.to_string();
    let redriven = mcp.doc("redrive_dead_letter", json!({"id": mailer}));
    assert_eq!(
        redriven,
        json!({"id": mailer, "outcome": "redriven", "moot": null})
    );
    let dead = mcp.doc("list_dead_letters", json!({}));
    assert_eq!(dead, json(url, &["dead", "list", "--json"]));
    assert_eq!(dead["dead_letters"].as_array().unwrap().len(), 1, "{dead}");
    assert_eq!(
        dead["dead_letters"][0]["id"],
        p.dead_sms.to_string().as_str()
    );

    mcp.finish();
    store.close().await;
}

// Without `--allow`, the tools only read: the actions are not listed, and a client
// that calls them anyway (an LLM talked into it by a saga's data) is refused, with
// nothing done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_allow_cannot_act() {
    let p = prepare(Backend::Sqlite).await;
    let url = p.url.as_str();
    let store = Store::connect(url).await.unwrap();
    let engine = Engine::new([common::trip(), mail()]).unwrap();
    let extra = add_sagas(&store, &engine).await;
    let before = everything(url);

    let mut mcp = Server::spawn(url, &[]);
    let init = open(&mut mcp);
    let instructions = init["instructions"].as_str().unwrap_or_default();
    assert!(instructions.contains("read-only"), "{init}");
    let list = mcp.request("tools/list", json!({})).expect("tools/list");
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
            "list_dead_letters",
            "list_sagas",
            "list_schedules",
            "show_saga",
            "status"
        ],
        "{list}"
    );
    let calls = [
        ("abort_saga", json!({"id": extra.running.to_string()})),
        (
            "signal_saga",
            json!({"id": extra.waiting.to_string(), "name": "approval", "data": 1}),
        ),
        (
            "redrive_dead_letter",
            json!({"id": p.dead_mailer.to_string()}),
        ),
        (
            "redrive_dead_letter",
            json!({"id": extra.moot.to_string(), "force": true}),
        ),
        ("start_saga", json!({"name": "trip", "data": {}})),
        (
            "pause_saga",
            json!({"id": extra.running.to_string(), "reason": "x"}),
        ),
    ];
    for (tool, args) in calls {
        let (kind, message) = mcp.error(tool, args);
        assert_eq!(kind, "forbidden", "{tool}: {message}");
        assert!(message.contains("--allow"), "{tool}: {message}");
    }
    mcp.finish();
    assert_eq!(everything(url), before, "nothing was done");

    // Allowed one by one: `abort` allows abort_saga and nothing else.
    let mut mcp = Server::spawn(url, &["abort"]);
    open(&mut mcp);
    let (kind, _) = mcp.error(
        "redrive_dead_letter",
        json!({"id": p.dead_mailer.to_string()}),
    );
    assert_eq!(kind, "forbidden");
    let aborted = mcp.doc("abort_saga", json!({"id": extra.running.to_string()}));
    assert_eq!(aborted["saga"]["state"], "compensating", "{aborted}");
    mcp.finish();

    let line = common::fails(url, &["mcp", "--allow", "abort,drop_tables"]);
    assert!(line.contains("unknown action `drop_tables`"), "{line}");
    store.close().await;
}

// A wait is a person's decision unless its definition says agents may signal it (the
// saga's author had to remember nothing), and a person's decision is never signalled
// through MCP, even with `--allow signal`: refused, nothing written; the person's path
// (the CLI) sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_never_signalled_through_mcp() {
    let p = prepare(Backend::Sqlite).await;
    let url = p.url.as_str();
    let store = Store::connect(url).await.unwrap();
    let engine = Engine::new([common::trip(), mail(), transfer()]).unwrap();
    let id = common::start(&store, &engine, "transfer", &json!({"amount": 10_000})).await;
    common::pump_until(&store, &engine, "the transfer waits", async || {
        let saga = query::get(&store, id).await.unwrap().unwrap();
        saga.waiting_for.is_some()
    })
    .await;
    let before = everything(url);

    let mut mcp = Server::spawn(url, &["start", "signal", "abort", "redrive"]);
    open(&mut mcp);
    let waiting = mcp.doc("list_sagas", json!({"waiting": true}));
    assert_eq!(waiting["sagas"][0]["waiting_for"], "sign_off", "{waiting}");
    for args in [
        json!({"id": id.to_string(), "name": "sign_off", "data": {"by": "an LLM"}}),
        json!({"id": id.to_string(), "name": "sign_off"}),
        json!({"id": id.to_string(), "name": "sign_off", "reject": "no"}),
    ] {
        let (kind, message) = mcp.error("signal_saga", args);
        assert_eq!(kind, "refused", "{message}");
        assert!(message.contains("person's decision"), "{message}");
    }
    mcp.finish();
    assert_eq!(everything(url), before, "nothing was written");

    // A person, through the CLI: recorded (not a duplicate: MCP wrote nothing).
    let out = common::ok(url, &["sagas", "signal", &id.to_string(), "sign_off"]);
    assert!(out.contains("signal `sign_off` sent"), "{out}");
    common::pump(&store, &engine, &[id]).await;
    let saga = query::get(&store, id).await.unwrap().unwrap();
    assert_eq!(saga.state, SagaState::Completed);
    store.close().await;
}

// Stdin closed before the handshake: the server ends with one error line on stderr and
// nothing on stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_no_session() {
    let p = prepare(Backend::Sqlite).await;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentsaga"));
    cmd.env_remove("DATABASE_URL")
        .args(["--database-url", &p.url, "mcp"])
        .stdin(Stdio::null());
    let r = common::run_cmd(cmd);
    let line = common::expect_failure(&r, &"mcp with no client");
    assert!(line.contains("MCP session not started"), "{line}");
}
