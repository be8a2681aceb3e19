//! `sagas pause` and `sagas resume`: a paused saga sends nothing new, `sagas show` and
//! `sagas list` say who paused it, when and why; resumed, it goes on. A missing or
//! empty reason is a usage error, a refusal changes nothing.

use std::process::Command;

use agentsaga_core::Store;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::testing::quick_engine;
use agentsaga_saga::{StepState, query};
use serde_json::{Value, json};

use crate::common::{self, assert_keys, fails, json, ok, run, run_cmd};
use crate::documents::*;

/// `agentsaga sagas pause ID --reason R` with `USER` set to `user` (or unset).
fn pause_as(url: &str, id: &str, user: Option<&str>) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentsaga"));
    cmd.env_remove("DATABASE_URL").env_remove("USER");
    if let Some(user) = user {
        cmd.env("USER", user);
    }
    cmd.args(["--database-url", url, "sagas", "pause", id, "--reason", "r"]);
    let r = run_cmd(cmd);
    assert_eq!(r.code, Some(0), "{r:?}");
    r.stdout
}

pub(crate) async fn pause_and_resume(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    let engine = quick_engine([common::trip()]);
    let done = common::start(&store, &engine, "trip", &json!({"case": "ok"})).await;
    common::pump(&store, &engine, &[done]).await;
    let running = common::start(&store, &engine, "trip", &json!({"case": "ok"})).await;
    let (id, done, url) = (running.to_string(), done.to_string(), url.as_str());

    // Bad pauses: a usage error (exit 2) or a refusal (exit 1), nothing changed.
    let before = show(url, &id);
    for args in [
        &["sagas", "pause", &id][..],
        &["sagas", "pause", &id, "--reason", ""],
        &["sagas", "pause", &id, "--reason", "x", "--by", ""],
    ] {
        let r = run(url, args);
        assert_eq!(r.code, Some(2), "{args:?}: {r:?}");
        assert!(r.stdout.is_empty() && r.stderr.contains("--"), "{r:?}");
    }
    let e = fails(url, &["sagas", "pause", "nope", "--reason", "x"]);
    assert!(e.contains("not a UUID"), "{e}");
    let e = fails(url, &["sagas", "pause", &id, "--reason", "   "]);
    assert!(e.contains("no reason"), "{e}");
    let e = fails(url, &["sagas", "pause", &done, "--reason", "x"]);
    assert!(e.contains("finished"), "{e}");
    let unknown = "0190a8f0-0000-7000-8000-000000000000";
    let e = fails(url, &["sagas", "pause", unknown, "--reason", "x"]);
    assert!(e.contains(&format!("no saga with id {unknown}")), "{e}");
    let e = fails(url, &["sagas", "resume", &id]);
    assert!(e.contains("not paused"), "{e}");
    assert_eq!(show(url, &id), before);

    // Paused: who, why and when, in `show` (text and JSON) and `list`.
    let pause = [
        "sagas",
        "pause",
        &id,
        "--reason",
        "checking the drafts",
        "--by",
        "ops-anna",
    ];
    let out = ok(url, &pause);
    assert!(
        out.contains(&format!("paused saga {id} (by ops-anna)")),
        "{out}"
    );
    assert!(
        out.contains(&format!("`agentsaga sagas resume {id}`")),
        "{out}"
    );
    let doc = show(url, &id);
    let paused = &doc["saga"]["paused"];
    assert_keys(paused, &["by", "reason", "at", "at_ms"]);
    assert_eq!(paused["by"], "ops-anna", "{doc}");
    assert_eq!(paused["reason"], "checking the drafts", "{doc}");
    assert!(
        is_rfc3339(&paused["at"]) && paused["at_ms"].is_i64(),
        "{doc}"
    );
    let at = paused["at"].as_str().unwrap();
    let human = ok(url, &["sagas", "show", &id]);
    for want in [
        format!("paused   by ops-anna at {at}: checking the drafts\n"),
        format!("paused: it sends nothing new until `agentsaga sagas resume {id}`"),
    ] {
        assert!(human.contains(&want), "{want}: {human}");
    }
    let table = ok(url, &["sagas", "list"]);
    assert!(table.contains("paused by ops-anna"), "{table}");
    let page = json(url, &["sagas", "list", "--json"]);
    let row = page["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id.as_str());
    assert_eq!(row.unwrap()["paused"], *paused, "{page}");
    let e = fails(url, &pause);
    assert!(e.contains("paused already"), "{e}");
    assert_eq!(show(url, &id), doc, "a refused pause changes nothing");

    // The runtime records the answer of what was sent, and sends nothing new.
    common::pump_until(&store, &engine, "its first step answered", async || {
        let steps = query::steps(&store, running).await.unwrap();
        steps
            .first()
            .is_some_and(|s| s.state == StepState::Succeeded)
    })
    .await;
    assert_eq!(show(url, &id)["steps"].as_array().unwrap().len(), 1);

    // Resumed: nothing paused shows; its runtime sends what was held, to the end.
    let out = ok(url, &["sagas", "resume", &id]);
    assert!(
        out.contains(&format!("resumed saga {id}: it is running")),
        "{out}"
    );
    assert_eq!(show(url, &id)["saga"]["paused"], Value::Null);
    assert!(!ok(url, &["sagas", "show", &id]).contains("paused"));
    common::pump(&store, &engine, &[running]).await;
    assert_eq!(show(url, &id)["saga"]["state"], "completed");

    // `--by` defaults to `$USER`, else `cli`.
    for (user, by) in [
        (Some("ops-ben"), "ops-ben"),
        (None, "cli"),
        (Some(""), "cli"),
    ] {
        let other = common::start(&store, &engine, "trip", &json!({"case": "ok"})).await;
        let other = other.to_string();
        let out = pause_as(url, &other, user);
        assert!(out.contains(&format!("(by {by})")), "{user:?}: {out}");
        assert_eq!(show(url, &other)["saga"]["paused"]["by"], by);
    }
    store.close().await;
}
