//! Schedules (sagas started on a cron calendar): created, listed, shown, paused,
//! resumed, replaced and deleted; bad ones refused before the database is touched;
//! what their firings did, as the tables and documents show it.

use std::time::{Duration, Instant};

use agentsaga_core::Store;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::testing::{quick_engine, trip};
use agentsaga_saga::{Saga, Step};
use serde_json::{Value, json};

use crate::common::{assert_keys, expect_failure, fails, json, ok, run};
use crate::documents::*;

fn show_schedule(url: &str, name: &str) -> Value {
    json(url, &["schedules", "show", name, "--json"])
}

/// create → list, show (text and JSON) → pause → resume → put → delete, and the
/// mistakes: a bad expression, time zone, policy, duration or input (exit 2, before
/// the database is opened), a name taken, a name unknown (exit 1).
pub(crate) async fn schedules(backend: Backend) {
    let url = fresh_url(backend).await;
    assert!(ok(&url, &["migrate"]).contains("schema up to date"));
    let url = url.as_str();
    assert_eq!(ok(url, &["schedules", "list"]).trim(), "no schedules");
    assert_eq!(
        json(url, &["schedules", "list", "--json"]),
        json!({"schedules": []})
    );

    let input = r#"{"case":"ok","at":{"$fire_time":"rfc3339"}}"#;
    let out = ok(
        url,
        &[
            "schedules",
            "create",
            "nightly",
            "--saga",
            "trip",
            "--cron",
            "0 3 * * *",
            "--time-zone",
            "Europe/Paris",
            "--input",
            input,
            "--overlap",
            "queue_one",
            "--catch-up",
            "all:5",
            "--late-after",
            "5m",
            "--jitter",
            "30s",
        ],
    );
    assert!(
        out.starts_with(
            "created schedule `nightly`: saga `trip` at `0 3 * * *` (Europe/Paris), next due "
        ),
        "{out}"
    );
    assert!(out.contains(" (in "), "{out}");

    let doc = show_schedule(url, "nightly");
    assert_keys(&doc, SCHEDULE_KEYS);
    assert_eq!(doc["saga"], "trip");
    assert_eq!(doc["cron"], "0 3 * * *");
    assert_eq!(doc["time_zone"], "Europe/Paris");
    assert_eq!(doc["input"], serde_json::from_str::<Value>(input).unwrap());
    assert_eq!(doc["overlap"], "queue_one");
    assert_eq!(doc["catch_up"], json!({"policy": "all", "max": 5}));
    assert_eq!(doc["late_after"], 300_000);
    assert_eq!(doc["jitter"], 30_000);
    assert_eq!(doc["paused"], false);
    assert_eq!(
        (doc["fired"].clone(), doc["skipped"].clone()),
        (json!(0), json!(0))
    );
    for null in ["last_error", "last_saga_id", "last_fired", "queued_slot"] {
        assert!(doc[null].is_null(), "{null}: {doc}");
    }
    // 03:00 in Paris is 01:00 or 02:00 UTC; it fires up to 30 s after.
    let next = doc["next_slot"].as_str().unwrap();
    assert!(
        next.ends_with("T01:00:00.000Z") || next.ends_with("T02:00:00.000Z"),
        "{doc}"
    );
    let (slot, due) = (
        doc["next_slot_ms"].as_i64().unwrap(),
        doc["next_due_ms"].as_i64().unwrap(),
    );
    assert!((slot..=slot + 30_000).contains(&due), "{doc}");
    for at in ["next_slot", "next_due", "created", "updated"] {
        assert!(is_rfc3339(&doc[at]), "{at}: {doc}");
    }
    let created_ms = doc["created_ms"].clone();

    let list = json(url, &["schedules", "list", "--json"]);
    assert_eq!(list["schedules"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["schedules"][0], doc);
    let table = ok(url, &["schedules", "list"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    for head in [
        "NAME",
        "SAGA",
        "CRON",
        "TIME ZONE",
        "PAUSED",
        "NEXT DUE",
        "LAST FIRED",
    ] {
        assert!(lines[0].contains(head), "{table}");
    }
    for cell in [
        "nightly",
        "trip",
        "0 3 * * *",
        "Europe/Paris",
        " no ",
        " (in ",
    ] {
        assert!(lines[1].contains(cell), "{cell}: {table}");
    }
    let text = ok(url, &["schedules", "show", "nightly"]);
    for line in [
        "schedule     nightly\n",
        "time zone    Europe/Paris\n",
        "overlap      queue_one\n",
        "catch-up     all:5\n",
        "late after   5m\n",
        "jitter       up to 30s\n",
        "paused       no\n",
        "last error   -\n",
        "fired        0\n",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }

    // Pause, twice; resume, twice.
    let out = ok(url, &["schedules", "pause", "nightly"]);
    assert!(out.starts_with("paused schedule `nightly`"), "{out}");
    assert_eq!(show_schedule(url, "nightly")["paused"], true);
    let out = ok(url, &["schedules", "pause", "nightly"]);
    assert!(out.contains("was paused already: nothing changed"), "{out}");
    let table = ok(url, &["schedules", "list"]);
    assert!(table.lines().nth(1).unwrap().contains(" yes "), "{table}");
    assert!(ok(url, &["schedules", "show", "nightly"]).contains("paused       yes"));
    let doc = json(url, &["schedules", "resume", "nightly", "--json"]);
    assert_eq!(doc["paused"], false, "{doc}");
    let out = ok(url, &["schedules", "resume", "nightly"]);
    assert!(out.contains("was not paused: nothing changed"), "{out}");

    // Put replaces it with what the flags say (defaults for the others), keeping its
    // creation; a new name is created.
    let out = ok(
        url,
        &[
            "schedules",
            "put",
            "nightly",
            "--saga",
            "trip",
            "--cron",
            "*/15 * * * *",
        ],
    );
    assert!(out.starts_with("replaced schedule `nightly`"), "{out}");
    let doc = show_schedule(url, "nightly");
    assert_eq!(doc["cron"], "*/15 * * * *");
    assert_eq!(doc["time_zone"], "UTC");
    assert_eq!(doc["overlap"], "skip");
    assert_eq!(doc["catch_up"], json!({"policy": "none"}));
    assert_eq!(doc["jitter"], 0);
    assert!(doc["input"].is_null(), "{doc}");
    assert_eq!(doc["created_ms"], created_ms);
    let args = [
        "schedules",
        "put",
        "weekly",
        "--saga",
        "job",
        "--cron",
        "0 0 9 * * MON",
    ];
    let out = ok(url, &[&args[..], &["--paused"]].concat());
    assert!(out.starts_with("created schedule `weekly`"), "{out}");
    assert!(out.contains("paused: it fires nothing until"), "{out}");
    assert_eq!(show_schedule(url, "weekly")["paused"], true);

    // Bad schedules: usage errors, nothing written; refused before the database is
    // opened (a database that does not exist is not even looked for).
    let create = ["schedules", "create", "x", "--saga", "trip"];
    for (flags, want) in [
        (&["--cron", "0 25 * * *"][..], "is not a cron expression"),
        (&["--cron", "0 3 * *"], "is not a cron expression"),
        (
            &["--cron", "0 3 * * *", "--time-zone", "Mars/Olympus"],
            "`Mars/Olympus` is not a time zone",
        ),
        (
            &["--cron", "0 3 * * *", "--overlap", "never"],
            "no overlap policy",
        ),
        (
            &["--cron", "0 3 * * *", "--catch-up", "all:0"],
            "catch-up all takes 1 to",
        ),
        (
            &["--cron", "0 3 * * *", "--catch-up", "some"],
            "no catch-up policy",
        ),
        (&["--cron", "0 3 * * *", "--jitter", "2d"], "jitter is over"),
        (
            &["--cron", "0 3 * * *", "--late-after", "5x"],
            "invalid duration \"5x\"",
        ),
        (&["--cron", "0 3 * * *", "--input", "{"], "not JSON"),
        (
            &["--cron", "0 3 * * *", "--input", r#"{"$fire_time":"x"}"#],
            "`$fire_time`",
        ),
    ] {
        let args = [&create[..], flags].concat();
        for url in [url, "sqlite:///nonexistent/agentsaga.db"] {
            let r = run(url, &args);
            let e = expect_failure(&r, &args);
            assert_eq!(r.code, Some(2), "a usage error: {r:?}");
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }
    // A name taken; names unknown: exit 1.
    let r = run(
        url,
        &[
            "schedules",
            "create",
            "nightly",
            "--saga",
            "trip",
            "--cron",
            "0 3 * * *",
        ],
    );
    let e = expect_failure(&r, "create nightly again");
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(
        e.contains("a schedule named `nightly` exists already"),
        "{e}"
    );
    assert_eq!(show_schedule(url, "nightly")["cron"], "*/15 * * * *");
    for verb in ["show", "pause", "resume", "delete"] {
        let r = run(url, &["schedules", verb, "nope"]);
        let e = expect_failure(&r, verb);
        assert_eq!(r.code, Some(1), "{r:?}");
        assert!(e.contains("no schedule named `nope`"), "{verb}: {e}");
    }
    let names = |url| -> Vec<Value> {
        json(url, &["schedules", "list", "--json"])["schedules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].clone())
            .collect()
    };
    assert_eq!(names(url), [json!("nightly"), json!("weekly")]);

    let out = ok(url, &["schedules", "delete", "nightly"]);
    assert!(out.starts_with("deleted schedule `nightly`"), "{out}");
    let e = fails(url, &["schedules", "delete", "nightly"]);
    assert!(e.contains("no schedule named `nightly`"), "{e}");
    assert_eq!(names(url), [json!("weekly")]);
}

/// What firings did, as `list` and `show` print it: a slot that started a saga, and
/// one whose input the saga refused (its `last_error`).
pub(crate) async fn schedule_firings(backend: Backend) {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Job {
        n: u32,
    }
    let job = Saga::<Job>::builder("job", 1)
        .step(
            Step::new("work", "worker")
                .command(|j: &Job| json!({"n": j.n}))
                .nothing_to_undo(),
        )
        .build()
        .unwrap();
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    let url = url.as_str();
    // Every second: one with an input its saga takes, one with an input it refuses.
    let every = ["--cron", "* * * * * *"];
    ok(
        url,
        &[
            &["schedules", "create", "good", "--saga", "trip"][..],
            &every,
        ]
        .concat(),
    );
    let bad = [
        "schedules",
        "create",
        "bad",
        "--saga",
        "job",
        "--input",
        r#"{"n":"one"}"#,
    ];
    ok(url, &[&bad[..], &every].concat());

    let engine = quick_engine([trip(), job]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        engine.fire_schedules(&store).await.unwrap();
        let (good, bad) = (show_schedule(url, "good"), show_schedule(url, "bad"));
        if good["fired"].as_i64() >= Some(1) && bad["skipped"].as_i64() >= Some(1) {
            break;
        }
        assert!(Instant::now() < deadline, "never fired: {good} {bad}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    store.close().await;

    let good = show_schedule(url, "good");
    assert!(good["last_error"].is_null(), "{good}");
    assert!(is_rfc3339(&good["last_fired"]), "{good}");
    let saga = good["last_saga_id"].as_str().unwrap().to_owned();
    assert_eq!(show(url, &saga)["saga"]["name"], "trip");
    let text = ok(url, &["schedules", "show", "good"]);
    assert!(text.contains(&format!("last saga    {saga}\n")), "{text}");

    let bad = show_schedule(url, "bad");
    let why = bad["last_error"].as_str().unwrap();
    assert!(why.contains("saga `job` could not start"), "{bad}");
    assert_eq!(bad["fired"], 0, "{bad}");
    let text = ok(url, &["schedules", "show", "bad"]);
    assert!(
        text.contains("last error   saga `job` could not start"),
        "{text}"
    );

    let table = ok(url, &["schedules", "list"]);
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name}: {table}"))
            .to_owned()
    };
    assert!(
        row("bad ").contains("saga `job` could not start"),
        "{table}"
    );
    assert!(
        row("good ").contains(good["last_fired"].as_str().unwrap()),
        "{table}"
    );
}
