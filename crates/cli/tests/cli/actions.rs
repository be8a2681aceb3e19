//! The actions on sagas, and signals: each one's effect on the tables.

use agentsaga_core::testing::{Backend, fresh_url};
use serde_json::json;

use crate::common::{self, fails, json, ok, prepare};
use crate::documents::*;

pub(crate) async fn actions(backend: Backend) {
    let p = prepare(backend).await;
    let url = p.url.as_str();

    // Skip the stuck compensation: the saga ends compensated, recorded as skipped.
    let id = p.stuck[0].to_string();
    let out = ok(url, &["sagas", "skip", &id]);
    assert!(out.contains("now compensated"), "{out}");
    let doc = show(url, &id);
    assert_eq!(doc["saga"]["state"], "compensated");
    assert_eq!(doc["steps"][0]["compensation_state"], "skipped");
    assert!(is_rfc3339(&doc["steps"][0]["compensated_at"]));
    let s = status(url);
    assert_eq!(s["sagas"]["stuck"], 2);
    assert_eq!(s["sagas"]["compensated"], 2);

    // An action the state refuses says why and changes nothing.
    let completed = p.completed.to_string();
    let before = show(url, &completed);
    let e = fails(url, &["sagas", "abort", &completed]);
    assert!(e.contains("completed"), "{e}");
    assert_eq!(show(url, &completed), before);
    let e = fails(url, &["sagas", "skip", &completed]);
    assert!(e.contains("completed"), "{e}");
    let e = fails(url, &["sagas", "retry", &id]);
    assert!(e.contains("compensated") && e.contains("only stuck"), "{e}");
    assert_eq!(show(url, &completed), before);

    // Retry a stuck compensation: dispatched again, one message pending.
    let other = p.stuck[1].to_string();
    let out = ok(url, &["sagas", "retry", &other]);
    assert!(out.contains("now compensating"), "{out}");
    let doc = show(url, &other);
    assert_eq!(doc["saga"]["state"], "compensating");
    assert_eq!(doc["steps"][0]["compensation_state"], "dispatched");
    assert_eq!(status(url)["outbox"]["pending"], 1);
    let e = fails(url, &["sagas", "abort", &other]);
    assert!(e.contains("compensating"), "{e}");

    // Stuck after its pivot: retry needs the definition and says so; abort gives up.
    let after = p.after_pivot.to_string();
    let e = fails(url, &["sagas", "retry", &after]);
    assert!(e.contains("definition"), "{e}");
    assert_eq!(show(url, &after)["saga"]["state"], "stuck");
    let out = ok(url, &["sagas", "abort", &after]);
    assert!(out.contains("now aborted"), "{out}");
    assert_eq!(status(url)["sagas"]["aborted"], 1);

    // Dead letters: re-drive one, purge the other.
    let mailer = p.dead_mailer.to_string();
    let out = ok(url, &["dead", "redrive", &mailer]);
    assert!(out.contains("pending again"), "{out}");
    let s = status(url);
    assert_eq!(s["outbox"]["dead"], 1);
    assert_eq!(s["outbox"]["pending"], 2);
    assert!(fails(url, &["dead", "show", &mailer]).contains("not found"));
    assert!(fails(url, &["dead", "redrive", &mailer]).contains("not found"));
    let out = ok(url, &["dead", "purge", "--older-than", "1h"]);
    assert!(out.starts_with("purged 0 dead letter(s)"), "{out}");
    let out = ok(url, &["dead", "purge", "--older-than", "0ms"]);
    assert!(out.starts_with("purged 1 dead letter(s)"), "{out}");
    assert_eq!(status(url)["dead_letters"], 0);
    let out = ok(url, &["dead", "redrive", "--all", "--destination", "sms"]);
    assert!(
        out.starts_with("re-drove 0 dead letter(s) to `sms`"),
        "{out}"
    );

    // Prune delivered rows and inbox records.
    let delivered = status(url)["outbox"]["delivered"].as_u64().unwrap();
    assert!(delivered > 0);
    let out = ok(url, &["prune", "--older-than", "7d"]);
    assert!(
        out.starts_with("pruned 0 delivered outbox row(s) and 0 inbox record(s)"),
        "{out}"
    );
    // The inbox records are minutes old: inside the redelivery window, kept.
    let out = ok(url, &["prune", "--older-than", "0s"]);
    let want = format!("pruned {delivered} delivered outbox row(s) older than 0ms and 0 inbox");
    assert!(out.starts_with(&want), "{out}");
    let s = status(url);
    assert_eq!(s["outbox"]["delivered"], 0);
    assert_eq!(s["outbox"]["pending"], 2, "prune leaves pending rows alone");

    let out = ok(url, &["migrate"]);
    assert!(out.contains("schema up to date"), "{out}");
}

// `sagas signal`: a saga parked at a wait is listed as waiting (`--waiting`, the
// `waiting_for` field); the signal approves it once (a second one changes nothing);
// a name it never waits for, or a finished saga, is refused with nothing written.
pub(crate) async fn signals(backend: Backend) {
    use agentsaga_saga::{Engine, Saga, SagaState, Step, query};
    let url = fresh_url(backend).await;
    let store = agentsaga_core::Store::connect(&url).await.unwrap();
    let mail = Saga::<serde_json::Value>::builder("mail", 1)
        .step(Step::new("draft", "drafts").nothing_to_undo())
        .step(
            Step::wait_for("approval")
                .on_reply(|d: &mut serde_json::Value, a: serde_json::Value| d["approved"] = a),
        )
        .pivot(Step::new("send", "sender"))
        .build()
        .unwrap();
    let engine = Engine::new([mail]).unwrap();
    let id = common::start(&store, &engine, "mail", &json!({ "to": "ann" })).await;
    common::pump_until(&store, &engine, "the saga waits", async || {
        query::get(&store, id)
            .await
            .unwrap()
            .unwrap()
            .waiting_for
            .is_some()
    })
    .await;

    let waiting = json(&url, &["sagas", "list", "--waiting", "--json"]);
    let waiting = waiting["sagas"].as_array().unwrap();
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0]["id"], id.to_string().as_str());
    assert_eq!(waiting[0]["waiting_for"], "approval");
    assert_eq!(
        show(&url, &id.to_string())["saga"]["waiting_for"],
        "approval"
    );
    let table = ok(&url, &["sagas", "list"]);
    assert!(
        table.contains("WAITING") && table.contains("approval"),
        "{table}"
    );

    let sid = id.to_string();
    // `sagas signal <id> <name> [flag value]`.
    let signal = |name, flag: &[&'static str]| {
        let mut args = vec!["sagas", "signal", sid.as_str(), name];
        args.extend_from_slice(flag);
        args
    };
    let bad = fails(&url, &signal("payment", &[]));
    assert!(bad.contains("never waits for `payment`"), "{bad}");
    let bad = fails(&url, &signal("approval", &["--data", "{not json"]));
    assert!(bad.contains("--data is not JSON"), "{bad}");
    let sent = ok(&url, &signal("approval", &["--data", r#"{"by":"ops"}"#]));
    assert!(sent.contains("signal `approval` sent"), "{sent}");
    let again = ok(&url, &signal("approval", &["--reject", "no"]));
    assert!(again.contains("nothing changed"), "{again}");

    common::pump(&store, &engine, &[id]).await;
    let saga = query::get(&store, id).await.unwrap().unwrap();
    assert_eq!(saga.state, SagaState::Completed);
    let refused = fails(&url, &signal("approval", &[]));
    assert!(refused.contains("the saga is completed"), "{refused}");
    store.close().await;
}

// `sagas list --sleeping`: a saga parked at a sleep is listed with when it wakes (the
// table's WAITING column says so), `sagas show` says it, and `--waiting` does not
// list it.
pub(crate) async fn sleeping(backend: Backend) {
    use agentsaga_saga::{Engine, Saga, Step};
    let url = fresh_url(backend).await;
    let store = agentsaga_core::Store::connect(&url).await.unwrap();
    let napper = Saga::<serde_json::Value>::builder("napper", 1)
        .step(Step::sleep("nap", std::time::Duration::from_secs(3600)))
        .pivot(Step::new("send", "sender"))
        .build()
        .unwrap();
    let engine = Engine::new([napper]).unwrap();
    let id = common::start(&store, &engine, "napper", &json!({})).await;
    let sleeping = json(&url, &["sagas", "list", "--sleeping", "--json"]);
    let sleeping = sleeping["sagas"].as_array().unwrap();
    assert_eq!(sleeping.len(), 1);
    assert_eq!(sleeping[0]["id"], id.to_string().as_str());
    let until = sleeping[0]["sleeping_until"].as_str().unwrap().to_owned();
    assert!(sleeping[0]["sleeping_until_ms"].as_i64().is_some());
    let waiting = json(&url, &["sagas", "list", "--waiting", "--json"]);
    assert!(waiting["sagas"].as_array().unwrap().is_empty(), "{waiting}");
    let table = ok(&url, &["sagas", "list"]);
    assert!(table.contains(&format!("sleeps until {until}")), "{table}");
    let shown = ok(&url, &["sagas", "show", &id.to_string()]);
    assert!(
        shown.contains(&format!("sleeping until {until}")),
        "{shown}"
    );
    store.close().await;
}
