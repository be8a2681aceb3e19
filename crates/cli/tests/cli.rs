//! The `agentsaga` binary against databases prepared by the saga engine, on SQLite and
//! PostgreSQL: the JSON documents, each action's effect on the tables, and bad input.

mod common;

use std::process::Command;

use agentsaga_core::both_backends;
use agentsaga_core::testing::{Backend, fresh_url};
use serde_json::{Value, json};

use common::{assert_keys, expect_failure, fails, json, ok, prepare, run, run_cmd, sqlite_path};

use agentsaga_core::{Message, MessageId, Receipt, Store};
use agentsaga_saga::{Engine, Saga, Step};

const SAGA_KEYS: &[&str] = &[
    "id",
    "name",
    "version",
    "state",
    "key",
    "waiting_for",
    "error",
    "created_at",
    "created_at_ms",
    "updated_at",
    "updated_at_ms",
];
const STEP_KEYS: &[&str] = &[
    "idx",
    "stage",
    "name",
    "destination",
    "state",
    "attempts",
    "error",
    "dispatched_at",
    "dispatched_at_ms",
    "replied_at",
    "replied_at_ms",
    "compensation_destination",
    "compensation_payload",
    "compensation_state",
    "compensation_attempts",
    "compensation_error",
    "compensated_at",
    "compensated_at_ms",
];
const DEAD_KEYS: &[&str] = &[
    "id",
    "seq",
    "destination",
    "key",
    "attempts",
    "created_at",
    "created_at_ms",
    "last_error",
    "headers",
    "payload",
    "moot",
];

fn status(url: &str) -> Value {
    json(url, &["status", "--json"])
}

fn show(url: &str, id: &str) -> Value {
    json(url, &["sagas", "show", id, "--json"])
}

/// `2024-05-01T12:34:56.789Z`.
fn is_rfc3339(v: &Value) -> bool {
    let s = v.as_str().unwrap_or_default();
    s.len() == 24 && s.ends_with('Z') && s.as_bytes()[10] == b'T' && s.starts_with("20")
}

async fn read_commands(backend: Backend) {
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
    assert_keys(&doc, &["saga", "data", "steps"]);
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
both_backends!(read_tests, read_commands);

async fn actions(backend: Backend) {
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
both_backends!(action_tests, actions);

async fn bad_ids_and_values(backend: Backend) {
    let url = fresh_url(backend).await;
    // A database agentsaga never migrated (an empty SQLite file, a fresh Postgres
    // database) is refused by every command but `migrate`, and left as it was.
    if backend == Backend::Sqlite {
        std::fs::write(sqlite_path(&url), b"").unwrap();
    }
    for args in [&["status"][..], &["dead", "purge", "--older-than", "1d"]] {
        let e = fails(&url, args);
        assert!(e.contains("holds no agentsaga tables"), "{e}");
    }
    if backend == Backend::Sqlite {
        assert_eq!(std::fs::metadata(sqlite_path(&url)).unwrap().len(), 0);
    }
    assert!(ok(&url, &["migrate"]).contains("schema up to date"));
    let unknown = "0190a8f0-0000-7000-8000-000000000000";
    for args in [
        &["sagas", "show", unknown][..],
        &["sagas", "abort", unknown],
        &["sagas", "retry", unknown],
        &["sagas", "skip", unknown],
    ] {
        let e = fails(&url, args);
        assert!(e.contains(&format!("no saga with id {unknown}")), "{e}");
    }
    for args in [
        &["dead", "show", unknown][..],
        &["dead", "redrive", unknown],
    ] {
        let e = fails(&url, args);
        assert!(e.contains("not found"), "{e}");
    }
    for (args, want) in [
        (&["sagas", "show", "nope"][..], "not a UUID"),
        (&["sagas", "abort", "1234"], "not a UUID"),
        (&["dead", "show", "xyz"], "not a UUID"),
        (&["dead", "redrive", "xyz"], "not a UUID"),
        (&["prune", "--older-than", "7x"], "invalid duration \"7x\""),
        (
            &["dead", "purge", "--older-than", "soon"],
            "expected a number and a unit",
        ),
        (
            &["sagas", "list", "--state", "bogus"],
            "unknown saga state `bogus`",
        ),
    ] {
        let r = run(&url, args);
        let e = expect_failure(&r, &args);
        assert_eq!(r.code, Some(2), "a usage error: {r:?}");
        assert!(e.contains(want), "{args:?}: {e}");
    }
    let s = status(&url);
    assert_eq!(s["sagas_total"], 0);
    assert_eq!(s["outbox"]["pending"], 0);
}
both_backends!(bad_input_tests, bad_ids_and_values);

#[tokio::test]
async fn a_missing_sqlite_file_is_never_created() {
    let url = fresh_url(Backend::Sqlite).await;
    let path = sqlite_path(&url).to_owned();
    let dir = path.parent().unwrap().to_owned();
    let unknown = "0190a8f0-0000-7000-8000-000000000000";
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["sagas", "list"],
        &["sagas", "show", unknown],
        &["sagas", "abort", unknown],
        &["dead", "list", "--json"],
        &["dead", "redrive", "--all"],
        &["dead", "purge", "--older-than", "1d"],
        &["prune", "--older-than", "1d"],
    ] {
        let e = fails(&url, args);
        assert!(e.contains("does not exist"), "{args:?}: {e}");
        // A bare path too, relative to the working directory.
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentsaga"));
        cmd.current_dir(&dir)
            .env("DATABASE_URL", "test.db")
            .args(args);
        let e = expect_failure(&run_cmd(cmd), &args);
        assert!(e.contains("`test.db` does not exist"), "{args:?}: {e}");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "{args:?} created {left:?}");
    }
    // `migrate` is the one command that creates it.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentsaga"));
    cmd.current_dir(&dir)
        .env("DATABASE_URL", "test.db")
        .arg("migrate");
    let r = run_cmd(cmd);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.contains("backend: sqlite"), "{r:?}");
    assert!(path.exists());
    assert_eq!(status(&url)["sagas_total"], 0);
}

#[test]
fn bad_urls_and_no_url() {
    let e = fails("mysql://root@127.0.0.1/db", &["status"]);
    assert!(e.contains("unsupported scheme `mysql`"), "{e}");
    let e = fails("postgres://u:secret@127.0.0.1:1/db", &["status"]);
    assert!(e.contains("cannot open the postgres database"), "{e}");
    assert!(!e.contains("secret"), "the password is not printed: {e}");
    let e = fails("sqlite://x.db?mode=bogus", &["migrate"]);
    assert!(e.contains("invalid database url"), "{e}");
    // A password in the query string is not printed either, whoever writes the message.
    for url in [
        "postgres://u@127.0.0.1:1/db?password=secret",
        "postgres://u@127.0.0.1:1/db?sslmode=disable&sslpassword=secret",
        "mysql://root@127.0.0.1/db?password=secret",
        "sqlite://x.db?mode=bogus&password=secret",
    ] {
        let e = fails(url, &["migrate"]);
        assert!(!e.contains("secret"), "the password is not printed: {e}");
        assert!(e.contains("password=***"), "{e}");
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentsaga"));
    cmd.env_remove("DATABASE_URL").arg("status");
    let e = expect_failure(&run_cmd(cmd), &"no url");
    assert!(e.contains("DATABASE_URL"), "{e}");
}

// A dead-lettered saga command whose saga has since compensated is moot: re-driving it
// would let the do land after its undo. `dead list` says so, `redrive` refuses it (one
// or `--all`), and `--force` purges it instead.
async fn moot_dead_letters_are_not_redriven(backend: Backend) {
    use agentsaga_core::queue::{Claim, DeadLetter};
    use agentsaga_core::{DeliveryFailed, Store};
    use agentsaga_saga::Engine;
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    let engine = Engine::new([common::trip()]).unwrap();
    let mut tx = store.begin().await.unwrap();
    let id = engine
        .start(&mut tx, "trip", &json!({"case": "ok"}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let destinations = vec!["reserve-agent".to_owned()];
    let claim = Claim {
        owner: "t",
        destinations: &destinations,
        limit: 1,
        lease: std::time::Duration::from_secs(60),
    };
    let command = store.queue().claim(&claim).await.unwrap().remove(0);
    let reason = "reserve-agent: attempts exhausted";
    let notice = DeliveryFailed::notice_for(&command, reason).unwrap();
    store
        .queue()
        .dead_letter(
            "t",
            &[DeadLetter {
                seq: command.seq,
                reason: reason.into(),
                notice,
            }],
        )
        .await
        .unwrap();
    // The notice reaches the saga, which compensates (the undo is delivered).
    common::pump(&store, &engine, &[id]).await;
    let saga = json(&url, &["sagas", "show", &id.to_string(), "--json"]);
    assert_eq!(saga["saga"]["state"], "compensated");
    let dead = command.id.to_string();

    let list = json(&url, &["dead", "list", "--json"]);
    let moot = list["dead_letters"][0]["moot"].as_str().unwrap_or_default();
    assert!(moot.contains("compensated"), "{list}");
    let e = fails(&url, &["dead", "redrive", &dead]);
    assert!(e.contains("refused") && e.contains("--force"), "{e}");
    let out = ok(&url, &["dead", "redrive", "--all"]);
    assert!(
        out.contains("re-drove 0") && out.contains("refused"),
        "{out}"
    );
    assert_eq!(status(&url)["outbox"]["dead"], 1, "still dead, not pending");
    let out = ok(&url, &["dead", "redrive", &dead, "--force"]);
    assert!(out.contains("purged"), "{out}");
    assert_eq!(status(&url)["outbox"]["dead"], 0);
    assert!(fails(&url, &["dead", "show", &dead]).contains("not found"));
}
both_backends!(moot_tests, moot_dead_letters_are_not_redriven);

// `sagas signal`: a saga parked at a wait is listed as waiting (`--waiting`, the
// `waiting_for` field); the signal approves it once (a second one changes nothing);
// a name it never waits for, or a finished saga, is refused with nothing written.
async fn signals(backend: Backend) {
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
    let mut tx = store.begin().await.unwrap();
    let id = engine
        .start(&mut tx, "mail", &json!({ "to": "ann" }))
        .await
        .unwrap();
    tx.commit().await.unwrap();
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

    let bad = fails(&url, &["sagas", "signal", &id.to_string(), "payment"]);
    assert!(bad.contains("never waits for `payment`"), "{bad}");
    let bad = fails(
        &url,
        &[
            "sagas",
            "signal",
            &id.to_string(),
            "approval",
            "--data",
            "{not json",
        ],
    );
    assert!(bad.contains("--data is not JSON"), "{bad}");
    let sent = ok(
        &url,
        &[
            "sagas",
            "signal",
            &id.to_string(),
            "approval",
            "--data",
            r#"{"by":"ops"}"#,
        ],
    );
    assert!(sent.contains("signal `approval` sent"), "{sent}");
    let again = ok(
        &url,
        &[
            "sagas",
            "signal",
            &id.to_string(),
            "approval",
            "--reject",
            "no",
        ],
    );
    assert!(again.contains("nothing changed"), "{again}");

    common::pump(&store, &engine, &[id]).await;
    let saga = query::get(&store, id).await.unwrap().unwrap();
    assert_eq!(saga.state, SagaState::Completed);
    let refused = fails(&url, &["sagas", "signal", &id.to_string(), "approval"]);
    assert!(refused.contains("the saga is completed"), "{refused}");
    store.close().await;
}
both_backends!(signal_tests, signals);

// A saga whose reply was dead-lettered is stalled: `status` counts it and
// `sagas list --stalled` lists it (a running saga with its command pending is not).
async fn stalled_sagas_are_reported(backend: Backend) {
    use agentsaga_core::queue::{Claim, DeadLetter};
    use agentsaga_core::{Store, header};
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
    let mut tx = store.begin().await.unwrap();
    tx.receive("reserve-agent", command.id).await.unwrap();
    let reply = protocol::reply(command, &protocol::StepOutcome::Ok(json!("r-1")))
        .unwrap()
        .unwrap();
    tx.enqueue(&reply).await.unwrap();
    tx.commit().await.unwrap();
    store
        .queue()
        .mark_delivered("t", &[command.seq])
        .await
        .unwrap();
    let reply = claim("saga.trip.v1").await.remove(0);
    let dead = DeadLetter {
        seq: reply.seq,
        reason: "lost".into(),
        notice: None,
    };
    store.queue().dead_letter("t", &[dead]).await.unwrap();

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
both_backends!(stalled_tests, stalled_sagas_are_reported);

/// Runs `sql` (one statement, `id` bound as its one parameter if given) in a
/// transaction of its own.
async fn exec(store: &Store, sqlite: &'static str, postgres: &'static str, id: Option<MessageId>) {
    let mut tx = store.begin().await.unwrap();
    agentsaga_core::match_conn!(tx.conn(), sqlite(c) => {
        let mut q = agentsaga_core::sqlx::query(sqlite);
        if let Some(id) = id {
            q = q.bind(id);
        }
        q.execute(c).await.unwrap();
    }, postgres(c) => {
        let mut q = agentsaga_core::sqlx::query(postgres);
        if let Some(id) = id {
            q = q.bind(id);
        }
        q.execute(c).await.unwrap();
    });
    tx.commit().await.unwrap();
}

/// Is the inbox record (`consumer`, `id`) still there? (Asked by receiving it again, in
/// a transaction rolled back.)
async fn has_record(store: &Store, consumer: &str, id: MessageId) -> bool {
    let mut tx = store.begin().await.unwrap();
    let r = tx.receive(consumer, id).await.unwrap();
    tx.rollback().await.unwrap();
    r == Receipt::Duplicate
}

/// `prune` never deletes an inbox record inside the redelivery window, whatever
/// `--older-than` says; nor, however old, one whose message this database may still
/// deliver again (its outbox row not delivered: a process was down, its lease ran out
/// meanwhile, and the relay will hand the message over again after the restart).
async fn prune_keeps_inbox_records_a_redelivery_can_still_need(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    let live = Message::to("mailer").json(&json!({"n": 1})).unwrap();
    let (young, old, old_live) = (MessageId::new(), MessageId::new(), live.id);
    let mut tx = store.begin().await.unwrap();
    tx.enqueue(&live).await.unwrap();
    for id in [young, old, old_live] {
        assert_eq!(tx.receive("mailer", id).await.unwrap(), Receipt::First);
    }
    tx.commit().await.unwrap();
    // Two of them received a day ago.
    for id in [old, old_live] {
        exec(
            &store,
            "UPDATE inbox SET received_at = received_at - 86400000 WHERE message_id = ?1",
            "UPDATE inbox SET received_at = received_at - interval '1 day' WHERE message_id = $1",
            Some(id),
        )
        .await;
    }
    store.close().await;

    let out = ok(&url, &["prune", "--older-than", "0s"]);
    assert!(out.contains(" and 1 inbox record(s) older than "), "{out}");
    assert!(out.contains("redelivery window"), "{out}");
    let store = Store::connect(&url).await.unwrap();
    assert!(
        has_record(&store, "mailer", young).await,
        "a record inside the redelivery window was pruned"
    );
    assert!(
        has_record(&store, "mailer", old_live).await,
        "the record of a message still to be delivered was pruned"
    );
    assert!(
        !has_record(&store, "mailer", old).await,
        "the old record is kept"
    );
    store.close().await;
}
both_backends!(
    prune_inbox_tests,
    prune_keeps_inbox_records_a_redelivery_can_still_need
);

/// The applied migrations and the number of columns of every table: what a command
/// that wrote the schema would change.
async fn schema_of(url: &str) -> (Vec<i64>, i64) {
    use agentsaga_core::sqlx::{self, Connection as _};
    const VERSIONS: &str = "SELECT version FROM _sqlx_migrations ORDER BY version";
    if url.starts_with("sqlite") {
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        let v = sqlx::query_scalar(VERSIONS)
            .fetch_all(&mut c)
            .await
            .unwrap();
        let n = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master m, pragma_table_info(m.name) WHERE m.type = 'table'",
        )
        .fetch_one(&mut c)
        .await
        .unwrap();
        (v, n)
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        let v = sqlx::query_scalar(VERSIONS)
            .fetch_all(&mut c)
            .await
            .unwrap();
        let n = sqlx::query_scalar(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema()",
        )
        .fetch_one(&mut c)
        .await
        .unwrap();
        (v, n)
    }
}

/// A database whose schema is behind the binary is never migrated by a command other
/// than `migrate`: each refuses it, changing nothing, and says to run `agentsaga
/// migrate`; `migrate` brings it up to date.
async fn only_migrate_migrates(backend: Backend) {
    use agentsaga_core::sqlx::{self, Connection as _};
    let url = fresh_url(backend).await;
    // Migrated up to the migration before the newest, as an older agentsaga left it.
    let migrator = match backend {
        Backend::Sqlite => &agentsaga_core::migrate::SQLITE_MIGRATOR,
        Backend::Postgres => &agentsaga_core::migrate::POSTGRES_MIGRATOR,
    };
    let mut versions: Vec<i64> = migrator.iter().map(|m| m.version).collect();
    versions.sort_unstable();
    let older = versions[versions.len() - 2];
    if url.starts_with("sqlite") {
        let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
        let mut c = sqlx::SqliteConnection::connect_with(&options.create_if_missing(true))
            .await
            .unwrap();
        migrator.run_to(older, &mut c).await.unwrap();
        c.close().await.unwrap();
    } else {
        let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
        migrator.run_to(older, &mut c).await.unwrap();
        c.close().await.unwrap();
    }
    let before = schema_of(&url).await;
    let newest = migrator.iter().map(|m| m.version).max().unwrap();
    assert!(!before.0.contains(&newest), "{before:?}");
    let unknown = "0190a8f0-0000-7000-8000-000000000000";
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["sagas", "list"],
        &["sagas", "show", unknown],
        &["dead", "list", "--json"],
        &["starts", "list"],
        &["sagas", "abort", unknown],
        &["dead", "redrive", "--all"],
        &["prune", "--older-than", "1d"],
    ] {
        let e = fails(&url, args);
        assert!(e.contains("Run `agentsaga migrate`"), "{args:?}: {e}");
        assert!(
            e.contains(&format!("behind this binary's {newest}")),
            "{args:?}: {e}"
        );
        assert_eq!(schema_of(&url).await, before, "{args:?} changed the schema");
    }
    let out = ok(&url, &["migrate"]);
    assert!(out.contains(&format!("applied: {newest} ")), "{out}");
    assert!(out.contains("schema up to date"), "{out}");
    assert!(schema_of(&url).await.0.contains(&newest));
    assert_eq!(status(&url)["sagas_total"], 0);
    let out = ok(&url, &["migrate"]);
    assert!(out.contains("nothing to apply"), "{out}");
}
both_backends!(migrate_tests, only_migrate_migrates);

/// A waiting start that could not be started (its data no longer decodes after a
/// deploy) shows in `status` and `starts list`, and `starts remove` deletes it.
async fn set_aside_starts(backend: Backend) {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Job {
        n: u32,
    }
    fn saga<D>(command: fn(&D) -> Value) -> agentsaga_saga::SagaDefinition
    where
        D: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
    {
        Saga::<D>::builder("job", 1)
            .step(
                Step::new("work", "worker")
                    .command(command)
                    .nothing_to_undo(),
            )
            .build()
            .unwrap()
    }
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    // Any JSON at first: one in flight, a start waits.
    let engine = Engine::new([saga::<Value>(Value::clone)])
        .unwrap()
        .with_max_in_flight(Some(1));
    let mut tx = store.begin().await.unwrap();
    engine
        .accept(&mut tx, "job", json!({"n": 1}))
        .await
        .unwrap();
    let bad = engine
        .accept(&mut tx, "job", json!({"n": "one"}))
        .await
        .unwrap()
        .id();
    tx.commit().await.unwrap();
    // Then `Job`, with room for one more: its turn comes, it cannot start.
    let engine = Engine::new([saga::<Job>(|j| json!({"n": j.n}))])
        .unwrap()
        .with_max_in_flight(Some(2));
    let mut tx = store.begin().await.unwrap();
    assert!(engine.admit(&mut tx, "job").await.unwrap().is_empty());
    tx.commit().await.unwrap();
    store.close().await;

    let s = status(&url);
    assert_eq!(s["starts_set_aside"], json!({"job": 1}), "{s}");
    assert_eq!(s["starts_waiting"], json!({}), "{s}");
    let out = ok(&url, &["status"]);
    assert!(
        out.contains("starts set aside (could not start when their turn came): 1 (job 1)"),
        "{out}"
    );
    let list = json(&url, &["starts", "list", "--json"]);
    let starts = list["set_aside"].as_array().unwrap();
    assert_eq!(starts.len(), 1, "{list}");
    assert_keys(
        &starts[0],
        &[
            "id",
            "name",
            "data",
            "error",
            "created_at",
            "created_at_ms",
            "set_aside_at",
            "set_aside_at_ms",
        ],
    );
    assert_eq!(starts[0]["id"], bad.to_string());
    assert_eq!(starts[0]["data"], json!({"n": "one"}));
    assert!(
        starts[0]["error"].as_str().unwrap().contains("saga data"),
        "{list}"
    );
    assert!(is_rfc3339(&starts[0]["set_aside_at"]), "{list}");
    let out = ok(&url, &["starts", "list"]);
    assert!(out.contains(&bad.to_string()), "{out}");

    let out = ok(&url, &["starts", "remove", &bad.to_string()]);
    assert!(out.contains("removed the set-aside start"), "{out}");
    let e = fails(&url, &["starts", "remove", &bad.to_string()]);
    assert!(e.contains("no set-aside start"), "{e}");
    assert_eq!(ok(&url, &["starts", "list"]).trim(), "no set-aside starts");
    assert_eq!(status(&url)["starts_set_aside"], json!({}));
}
both_backends!(set_aside_tests, set_aside_starts);
