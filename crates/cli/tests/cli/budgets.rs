//! Usage and budgets: `sagas show` prints what a saga and its steps used, its budget and
//! why a spent one holds it; `sagas raise-budget` raises it (a person's act), printing
//! the saga, and refuses what it cannot do with nothing changed.

use agentsaga_core::Store;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::testing::{capped, pump, quick_engine, trip, waiting_for_raise};
use serde_json::json;

use crate::common::{self, fails, ok, run};
use crate::documents::*;

pub(crate) async fn budgets(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    let engine = quick_engine([trip(), capped()]);
    let data = json!({"case": "ok", "usage": {"tokens_out": 20, "cost_micros": 7}});
    let used = common::start(&store, &engine, "trip", &data).await;
    pump(&store, &engine, &[used]).await;
    let waiting = waiting_for_raise(&store, &engine).await;
    let (used, id) = (used.to_string(), waiting.to_string());
    let url = url.as_str();

    // What a completed saga used, in all and per step; it has no budget.
    let human = ok(url, &["sagas", "show", &used]);
    assert!(
        human.contains("usage    tokens_out 60, cost_micros 21\n"),
        "{human}"
    );
    assert!(human.contains("tokens_out 20, cost_micros 7"), "{human}");
    assert!(!human.contains("budget "), "{human}");
    let doc = show(url, &used);
    assert_eq!(
        doc["spending"]["usage"],
        json!({"tokens_out": 60, "cost_micros": 21})
    );
    assert_eq!(
        doc["steps"][2]["usage"],
        json!({"tokens_out": 20, "cost_micros": 7})
    );

    // A saga held by its spent budget says why, and how to raise it.
    let human = ok(url, &["sagas", "show", &id]);
    for want in [
        "usage    tokens_in 30, tokens_out 100\n".to_owned(),
        "budget   at most tokens_out 100; once spent, wait for a raise\n".to_owned(),
        format!(
            "held     spent: tokens_out 100 of 100, waiting for a raise: \
             `agentsaga sagas raise-budget {id} --tokens-out N`"
        ),
    ] {
        assert!(human.contains(&want), "{want}: {human}");
    }

    // Bad raises: a usage error (exit 2) or a refusal, nothing changed.
    let before = show(url, &id);
    let r = run(url, &["sagas", "raise-budget", &id]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stdout.is_empty(), "{r:?}");
    assert!(
        r.stderr.contains("required arguments were not provided")
            && r.stderr.contains("--tokens-out"),
        "{r:?}"
    );
    for bad in ["-5", "lots", "18446744073709551616"] {
        let r = run(url, &["sagas", "raise-budget", &id, "--tokens-out", bad]);
        assert_eq!(r.code, Some(2), "{bad}: {r:?}");
    }
    let e = fails(url, &["sagas", "raise-budget", "nope", "--calls", "3"]);
    assert!(e.contains("not a UUID"), "{e}");
    let e = fails(
        url,
        &["sagas", "raise-budget", &used, "--tokens-out", "500"],
    );
    assert!(e.contains("finished"), "{e}");
    assert_eq!(show(url, &id), before);

    // A raise sets the limits it names and prints the saga; its runtime goes on.
    let out = ok(
        url,
        &[
            "sagas",
            "raise-budget",
            &id,
            "--tokens-out",
            "1000",
            "--calls",
            "9",
        ],
    );
    assert!(
        out.contains("budget   at most tokens_out 1000, calls 9; once spent, wait for a raise"),
        "{out}"
    );
    assert!(out.contains("TIMELINE"), "printed as `sagas show`: {out}");
    let doc = show(url, &id);
    assert_eq!(
        doc["spending"]["budget"],
        json!({"tokens_out": 1000, "calls": 9})
    );
    assert_eq!(doc["spending"]["spent"], serde_json::Value::Null);
    pump(&store, &engine, &[waiting]).await;
    let doc = show(url, &id);
    assert_eq!(doc["saga"]["state"], "completed", "{doc}");
    assert_eq!(doc["spending"]["usage"]["tokens_out"], 300, "{doc}");
    let human = ok(url, &["sagas", "show", &id]);
    assert!(!human.contains("held "), "{human}");
    store.close().await;
}
