//! The read commands' documents and tables, and the stalled sagas they report.

use agentsaga_core::testing::{Backend, fresh_url};
use serde_json::{Value, json};

use crate::common::{self, assert_keys, json, ok, prepare};
use crate::documents::*;

pub(crate) async fn read_commands(backend: Backend) {
    let p = prepare(backend).await;
    let url = p.url.as_str();

    let s = status(url);
    assert_keys(
        &s,
        &[
            "backend",
            "outbox",
            "dead_letters",
            "sagas",
            "sagas_total",
            "stalled",
            "stalled_after_ms",
            "starts_waiting",
            "starts_set_aside",
        ],
    );
    assert_keys(
        &s["outbox"],
        &[
            "pending",
            "in_flight",
            "delivered",
            "dead",
            "oldest_pending_age_ms",
        ],
    );
    let backend_name = if backend == Backend::Sqlite {
        "sqlite"
    } else {
        "postgres"
    };
    assert_eq!(s["backend"], backend_name);
    assert_eq!(s["outbox"]["pending"], 0, "{s}");
    assert_eq!(s["outbox"]["in_flight"], 0);
    assert_eq!(s["outbox"]["dead"], 2);
    assert!(s["outbox"]["delivered"].as_u64().unwrap() > 10, "{s}");
    assert_eq!(s["outbox"]["oldest_pending_age_ms"], Value::Null);
    assert_eq!(s["dead_letters"], 2);
    assert_eq!(
        s["sagas"],
        json!({"running": 0, "compensating": 0, "completed": 1, "compensated": 1,
               "stuck": 3, "aborted": 0})
    );
    assert_eq!(s["sagas_total"], 5);
    let human = ok(url, &["status"]);
    assert!(human.contains("dead letters: 2"), "{human}");
    assert!(
        human
            .lines()
            .any(|l| l.split_whitespace().eq(["stuck", "3"])),
        "{human}"
    );

    let list = json(url, &["sagas", "list", "--json"]);
    assert_keys(&list, &["next_cursor", "sagas"]);
    assert_eq!(list["next_cursor"], Value::Null, "one page holds them all");
    let stalled = json(url, &["sagas", "list", "--stalled", "--json"]);
    assert_eq!(stalled["sagas"], json!([]), "stuck sagas are not stalled");
    let sagas = list["sagas"].as_array().unwrap();
    assert_eq!(sagas.len(), 5);
    for saga in sagas {
        assert_keys(saga, SAGA_KEYS);
        assert_eq!(saga["name"], "trip");
        assert_eq!(saga["version"], 1);
        assert!(is_rfc3339(&saga["created_at"]), "{saga}");
    }
    let stuck = json(url, &["sagas", "list", "--state", "stuck", "--json"]);
    assert_eq!(stuck["sagas"].as_array().unwrap().len(), 3);
    let none = json(url, &["sagas", "list", "--name", "other", "--json"]);
    assert_eq!(none["sagas"], json!([]));
    let one = json(url, &["sagas", "list", "--limit", "1", "--json"]);
    assert_eq!(one["sagas"].as_array().unwrap().len(), 1);
    let table = ok(url, &["sagas", "list", "--state", "completed"]);
    assert!(table.starts_with("ID"), "{table}");
    assert!(table.contains(&p.completed.to_string()), "{table}");
    assert!(table.contains("req-ok"), "the key shows: {table}");
    // The completed saga was started with an idempotency key: shown, and a filter.
    let keyed = json(url, &["sagas", "list", "--key", "req-ok", "--json"]);
    let keyed = keyed["sagas"].as_array().unwrap();
    assert_eq!(keyed.len(), 1);
    assert_eq!(keyed[0]["id"], p.completed.to_string().as_str());
    assert_eq!(keyed[0]["key"], "req-ok");
    assert_eq!(show(url, &p.completed.to_string())["saga"]["key"], "req-ok");
    let unkeyed = show(url, &p.stuck[0].to_string());
    assert_eq!(unkeyed["saga"]["key"], json!(null));

    let id = p.stuck[0].to_string();
    let doc = show(url, &id);
    assert_keys(
        &doc,
        &["saga", "data", "spending", "steps", "children", "rewinds"],
    );
    assert!(doc["data"].get("case").is_some(), "the saga's data: {doc}");
    assert_keys(&doc["saga"], SAGA_KEYS);
    assert_eq!(doc["saga"]["id"], id.as_str());
    assert_eq!(doc["saga"]["state"], "stuck");
    let steps = doc["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "the step after the pivot never ran: {doc}");
    for step in steps {
        assert_keys(step, STEP_KEYS);
        assert!(is_rfc3339(&step["dispatched_at"]), "{step}");
    }
    assert!(is_rfc3339(&steps[0]["replied_at"]), "{doc}");
    let reserve = &steps[0];
    assert_eq!(reserve["name"], "reserve");
    assert_eq!(reserve["state"], "succeeded");
    assert_eq!(reserve["compensation_destination"], "reserve-agent");
    assert_eq!(reserve["compensation_payload"], json!({"cancel": "stuck"}));
    assert_eq!(reserve["compensation_state"], "failed");
    assert_eq!(reserve["compensation_attempts"], 2);
    assert!(
        reserve["compensation_error"]
            .as_str()
            .unwrap()
            .contains("cancel API down")
    );
    assert_eq!(steps[1]["state"], "failed");
    assert!(
        steps[1]["error"]
            .as_str()
            .unwrap()
            .contains("card declined")
    );
    assert_eq!(steps[1]["compensation_state"], Value::Null);
    let human = ok(url, &["sagas", "show", &id]);
    for want in [
        "data     {\"case\":",
        "TIMELINE",
        "COMPENSATION LEDGER",
        "cancel API down",
        "sagas skip",
    ] {
        assert!(human.contains(want), "{want}: {human}");
    }

    let dead = json(url, &["dead", "list", "--json"]);
    assert_keys(&dead, &["dead_letters", "next_before"]);
    assert_eq!(dead["dead_letters"].as_array().unwrap().len(), 2);
    let mailer = json(url, &["dead", "list", "--destination", "mailer", "--json"]);
    let rows = mailer["dead_letters"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_keys(row, DEAD_KEYS);
    assert_eq!(row["id"], p.dead_mailer.to_string().as_str());
    assert_eq!(row["key"], "ops");
    assert_eq!(row["attempts"], 1);
    assert_eq!(row["headers"], json!({"trace": "t-1"}));
    assert_eq!(row["payload"]["subject"], "trip booked");
    assert!(row["last_error"].as_str().unwrap().contains("550"));
    assert!(is_rfc3339(&row["created_at"]));
    let one = json(url, &["dead", "show", &p.dead_mailer.to_string(), "--json"]);
    assert_eq!(&one, row);
    let human = ok(url, &["dead", "show", &p.dead_sms.to_string()]);
    assert!(human.contains("\"to\": \"+100\""), "{human}");
    assert!(human.contains("sms: 550 mailbox unavailable"), "{human}");
    let human = ok(url, &["dead", "list"]);
    assert_eq!(human.lines().count(), 3, "{human}");
}

// A saga whose reply was dead-lettered is stalled: `status` counts it and
// `sagas list --stalled` lists it (a running saga with its command pending is not).
pub(crate) async fn stalled_sagas_are_reported(backend: Backend) {
    use agentsaga_core::queue::Claim;
    use agentsaga_core::{Store, header};
    use agentsaga_saga::testing::{answer, dead_letter};
    use agentsaga_saga::{Engine, protocol};
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    let engine = Engine::new([common::trip()]).unwrap();
    let mut ids = Vec::new();
    for case in ["lost", "pending"] {
        let mut tx = store.begin().await.unwrap();
        ids.push(
            engine
                .start(&mut tx, "trip", &json!({ "case": case }))
                .await
                .unwrap(),
        );
        tx.commit().await.unwrap();
    }
    let claim = |destination: &str| {
        let store = store.clone();
        let destinations = vec![destination.to_owned()];
        async move {
            let claim = Claim {
                owner: "t",
                destinations: &destinations,
                limit: 10,
                lease: std::time::Duration::from_secs(60),
            };
            store.queue().claim(&claim).await.unwrap()
        }
    };
    let lost = ids[0].to_string();
    let commands = claim("reserve-agent").await;
    let command = commands
        .iter()
        .find(|e| e.header(header::SAGA_ID) == Some(lost.as_str()))
        .unwrap();
    let others: Vec<i64> = commands
        .iter()
        .filter(|e| e.id != command.id)
        .map(|e| e.seq)
        .collect();
    store.queue().release("t", &others).await.unwrap();
    answer(&store, command, &protocol::StepOutcome::Ok(json!("r-1"))).await;
    let reply = claim("saga.trip.v1").await.remove(0);
    dead_letter(&store, reply.seq, "lost").await;

    let status = json(&url, &["status", "--json"]);
    assert_eq!(status["stalled"], 1, "{status}");
    let listed = json(&url, &["sagas", "list", "--stalled", "--json"]);
    assert_eq!(listed["sagas"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["sagas"][0]["id"], lost.as_str());
    let human = ok(&url, &["status"]);
    assert!(
        human.contains("stalled sagas") && human.contains(": 1"),
        "{human}"
    );
    // With no threshold of progress, the pending one is stalled too.
    let all = json(
        &url,
        &[
            "--stalled-after",
            "0s",
            "sagas",
            "list",
            "--stalled",
            "--json",
        ],
    );
    assert_eq!(all["sagas"].as_array().unwrap().len(), 2, "{all}");
}
