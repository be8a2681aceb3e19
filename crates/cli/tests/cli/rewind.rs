//! `sagas rewind`: a step and those after it undone, then the saga run again from it;
//! `sagas show` says who rewound it to which step, when and why, "under way" until the
//! undos are done, then the steps undone. A missing or empty step or reason is a usage
//! error; a refusal (a step in flight: pause first) says why and changes nothing.

use std::process::Command;

use agentsaga_core::Store;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::testing::quick_engine;
use agentsaga_saga::{SagaId, StepState, query};
use serde_json::{Value, json};

use crate::common::{self, assert_keys, fails, ok, run, run_cmd};
use crate::documents::*;

const REWIND_KEYS: &[&str] = &[
    "to",
    "stage",
    "by",
    "reason",
    "at",
    "at_ms",
    "done_at",
    "done_at_ms",
    "undone",
];

const UNDONE_KEYS: &[&str] = &[
    "idx",
    "name",
    "output",
    "compensation",
    "compensated_at",
    "compensated_at_ms",
];

/// `agentsaga sagas rewind ID --to reserve --reason r` with `USER` set to `user`.
fn rewind_as(url: &str, id: &str, user: &str) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentsaga"));
    cmd.env_remove("DATABASE_URL").env("USER", user);
    cmd.args([
        "--database-url",
        url,
        "sagas",
        "rewind",
        id,
        "--to",
        "reserve",
        "--reason",
        "r",
    ]);
    let r = run_cmd(cmd);
    assert_eq!(r.code, Some(0), "{r:?}");
    r.stdout
}

/// Whether saga `id`'s first step (`reserve`) has answered.
async fn reserved(store: &Store, id: SagaId) -> bool {
    let steps = query::steps(store, id).await.unwrap();
    steps
        .first()
        .is_some_and(|s| s.state == StepState::Succeeded)
}

pub(crate) async fn rewinds(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    let engine = quick_engine([common::trip()]);
    let done = common::start(&store, &engine, "trip", &json!({"case": "ok"})).await;
    common::pump(&store, &engine, &[done]).await;
    let running = common::start(&store, &engine, "trip", &json!({"case": "ok"})).await;
    let other = common::start(&store, &engine, "trip", &json!({"case": "ok"})).await;
    let (id, done, url) = (running.to_string(), done.to_string(), url.as_str());

    // Bad rewinds: a usage error (exit 2) or a refusal (exit 1), nothing changed.
    let before = show(url, &id);
    assert_eq!(before["rewinds"], json!([]), "never rewound: {before}");
    for args in [
        &["sagas", "rewind", &id, "--reason", "x"][..],
        &["sagas", "rewind", &id, "--to", "reserve"],
        &["sagas", "rewind", &id, "--to", "", "--reason", "x"],
        &["sagas", "rewind", &id, "--to", "reserve", "--reason", ""],
        &[
            "sagas", "rewind", &id, "--to", "reserve", "--reason", "x", "--by", "",
        ],
    ] {
        let r = run(url, args);
        assert_eq!(r.code, Some(2), "{args:?}: {r:?}");
        assert!(r.stdout.is_empty() && r.stderr.contains("--"), "{r:?}");
    }
    let unknown = "0190a8f0-0000-7000-8000-000000000000";
    for (args, says) in [
        (
            [
                "sagas", "rewind", "nope", "--to", "reserve", "--reason", "x",
            ],
            "not a UUID".to_owned(),
        ),
        (
            ["sagas", "rewind", &id, "--to", "reserve", "--reason", "   "],
            "no reason".to_owned(),
        ),
        (
            ["sagas", "rewind", &id, "--to", "  ", "--reason", "x"],
            "no step".to_owned(),
        ),
        // `reserve` was sent and has not answered: pause, and rewind once it did.
        (
            ["sagas", "rewind", &id, "--to", "reserve", "--reason", "x"],
            "step `reserve` is in flight (pause the saga".to_owned(),
        ),
        (
            ["sagas", "rewind", &id, "--to", "charge", "--reason", "x"],
            "it has taken no step `charge`".to_owned(),
        ),
        (
            ["sagas", "rewind", &done, "--to", "reserve", "--reason", "x"],
            "only a running saga".to_owned(),
        ),
        (
            [
                "sagas", "rewind", unknown, "--to", "reserve", "--reason", "x",
            ],
            format!("no saga with id {unknown}"),
        ),
    ] {
        let e = fails(url, &args);
        assert!(e.contains(&says), "{args:?}: {e}");
    }
    assert_eq!(show(url, &id), before, "a refused rewind changes nothing");

    // Paused while `reserve` is out; once it answered, nothing is in flight.
    for saga in [running, other] {
        let saga = saga.to_string();
        ok(url, &["sagas", "pause", &saga, "--reason", "checking"]);
    }
    common::pump_until(&store, &engine, "both reservations answered", async || {
        reserved(&store, running).await && reserved(&store, other).await
    })
    .await;

    // Rewound: `reserve`'s undo under way, the pause over, the rewind shown.
    let rewind = [
        "sagas",
        "rewind",
        &id,
        "--to",
        "reserve",
        "--reason",
        "the wrong day was booked",
        "--by",
        "ops-anna",
    ];
    let out = ok(url, &rewind);
    assert!(
        out.contains(&format!("rewinding saga {id} to `reserve` (by ops-anna)")),
        "{out}"
    );
    let doc = show(url, &id);
    assert_eq!(doc["saga"]["state"], "compensating", "{doc}");
    assert_eq!(doc["saga"]["paused"], Value::Null, "a rewind ends a pause");
    let r = &doc["rewinds"][0];
    assert_keys(r, REWIND_KEYS);
    assert_eq!(
        (&r["to"], &r["stage"], &r["by"], &r["reason"]),
        (
            &json!("reserve"),
            &json!(0),
            &json!("ops-anna"),
            &json!("the wrong day was booked")
        ),
        "{doc}"
    );
    assert!(is_rfc3339(&r["at"]) && r["at_ms"].is_i64(), "{doc}");
    assert_eq!(r["done_at"], Value::Null, "under way: {doc}");
    assert_eq!(r["undone"], json!([]), "{doc}");
    let at = r["at"].as_str().unwrap().to_owned();
    let human = ok(url, &["sagas", "show", &id]);
    for want in [
        "\nREWINDS\n".to_owned(),
        format!("rewinding to `reserve` by ops-anna at {at}: the wrong day was booked\n"),
        "  under way: the steps from `reserve` on are undone, then it runs again from there\n"
            .to_owned(),
    ] {
        assert!(human.contains(&want), "{want}: {human}");
    }
    let e = fails(url, &rewind);
    assert!(e.contains("a rewind is under way"), "{e}");
    assert_eq!(show(url, &id), doc, "a refused rewind changes nothing");

    // Its runtime undoes `reserve` and runs the saga again from it, to the end.
    common::pump(&store, &engine, &[running]).await;
    let doc = show(url, &id);
    assert_eq!(doc["saga"]["state"], "completed", "{doc}");
    let r = &doc["rewinds"][0];
    assert_keys(r, REWIND_KEYS);
    assert!(
        is_rfc3339(&r["done_at"]) && r["done_at_ms"].is_i64(),
        "{doc}"
    );
    let undone = r["undone"].as_array().unwrap();
    assert_eq!(undone.len(), 1, "{doc}");
    assert_keys(&undone[0], UNDONE_KEYS);
    assert_eq!(
        (
            &undone[0]["name"],
            &undone[0]["compensation"],
            &undone[0]["output"]
        ),
        (&json!("reserve"), &json!("done"), &json!("done")),
        "{doc}"
    );
    let done_at = r["done_at"].as_str().unwrap();
    let human = ok(url, &["sagas", "show", &id]);
    for want in [
        format!("rewound to `reserve` by ops-anna at {at}: the wrong day was booked\n"),
        format!("  undid reserve (done); done at {done_at}\n"),
    ] {
        assert!(human.contains(&want), "{want}: {human}");
    }
    assert!(!human.contains("under way"), "{human}");
    let steps = doc["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3, "{doc}");
    assert!(steps.iter().all(|s| s["attempts"] == 1), "afresh: {doc}");

    // `--by` defaults to `$USER`.
    let other = other.to_string();
    let out = rewind_as(url, &other, "ops-ben");
    assert!(out.contains("(by ops-ben)"), "{out}");
    assert_eq!(show(url, &other)["rewinds"][0]["by"], "ops-ben");
    store.close().await;
}
