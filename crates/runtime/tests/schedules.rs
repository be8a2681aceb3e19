//! Schedules through the runtime, on both backends: created with
//! `runtime.schedules()`, checked against the runtime's sagas, fired by the runtime's
//! own task at their times, each slot one saga; paused, they fire nothing.

#[path = "support/echo.rs"]
mod echo;
#[path = "support/settle.rs"]
mod settle;

use std::collections::HashSet;
use std::time::Duration;

use agentsaga_core::both_backends;
use agentsaga_core::testing::{Backend, fresh_url, wait_until};
use agentsaga_runtime::Runtime;
use agentsaga_saga::query::{self, ListFilter};
use agentsaga_saga::schedule::{Overlap, Schedule};
use agentsaga_saga::{Saga, SagaState, Step};
use echo::Echo;
use serde_json::{Value, json};

async fn runtime(url: String) -> Runtime {
    let brief = Saga::<Value>::builder("brief", 1)
        .pivot(Step::new("draft", "writer"))
        .build()
        .unwrap();
    Runtime::builder()
        .database(url)
        .agent(Echo("writer"))
        .saga(brief)
        .start()
        .await
        .unwrap()
}

async fn sagas(rt: &Runtime) -> Vec<query::SagaSummary> {
    let all = ListFilter {
        limit: 1000,
        ..ListFilter::default()
    };
    query::list(rt.store(), &all).await.unwrap()
}

// A schedule every second fires on its own, each slot one saga (its start key the
// slot), with the slot's time in its input; paused, it fires nothing more.
async fn a_schedule_fires_at_its_times(backend: Backend) {
    let rt = runtime(fresh_url(backend).await).await;
    let s = Schedule::new("tick", "brief", "* * * * * *")
        .input(json!({ "at": { "$fire_time": "rfc3339" } }))
        .overlap(Overlap::Allow);
    let created = rt.schedules().create(&s).await.unwrap();
    assert!(created.next_slot_ms.is_some());
    wait_until(
        "three firings completed",
        Duration::from_secs(20),
        async || {
            sagas(&rt)
                .await
                .iter()
                .filter(|s| s.state == SagaState::Completed)
                .count()
                >= 3
        },
    )
    .await;
    let paused = rt.schedules().pause("tick").await.unwrap();
    assert!(paused.schedule.paused);
    let fired = sagas(&rt).await;
    let keys: HashSet<String> = fired.iter().filter_map(|s| s.key.clone()).collect();
    assert_eq!(keys.len(), fired.len(), "each saga its own slot: {keys:?}");
    for saga in &fired {
        let slot: i64 = saga
            .key
            .as_deref()
            .unwrap()
            .strip_prefix("schedule:tick:")
            .unwrap()
            .parse()
            .unwrap();
        let data = query::data(rt.store(), saga.id).await.unwrap().unwrap();
        let at: jiff::Timestamp = data["at"].as_str().unwrap().parse().unwrap();
        assert_eq!(at.as_millisecond(), slot, "the template receives the slot");
    }
    let view = rt.schedules().get("tick").await.unwrap().unwrap();
    assert_eq!(view.fired, i64::try_from(fired.len()).unwrap());
    // Paused: no firing for two more seconds' worth of slots.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(sagas(&rt).await.len(), fired.len());
    rt.shutdown().await;
}

both_backends!(fires, a_schedule_fires_at_its_times);

// What the runtime cannot fire is refused before anything is written: a saga it does
// not register, an input its saga refuses, a bad expression or time zone.
async fn bad_schedules_are_refused(backend: Backend) {
    let rt = runtime(fresh_url(backend).await).await;
    for (s, says) in [
        (Schedule::new("a", "nowhere", "* * * * *"), "nowhere"),
        (Schedule::new("b", "brief", "* * * *"), "cron"),
        (
            Schedule::new("c", "brief", "0 7 * * *").time_zone("Europe/Nowhere"),
            "Europe/Nowhere",
        ),
        (Schedule::new("", "brief", "0 7 * * *"), "name"),
    ] {
        let e = rt.schedules().create(&s).await.unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
    }
    assert!(rt.schedules().list().await.unwrap().is_empty());
    rt.shutdown().await;
}

both_backends!(refused, bad_schedules_are_refused);

// Two processes on one PostgreSQL database, a hundred schedules every second for a
// minute (each process fires whatever is due when it looks, the row lock deciding):
// every slot from each schedule's first firing to its last started exactly one saga
// (no slot lost between them, none fired twice: the firings counted equal the start
// keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_fire_a_hundred_schedules_each_slot_once() {
    if !agentsaga_core::testing::backends().contains(&Backend::Postgres) {
        return; // a build without PostgreSQL
    }
    let url = fresh_url(Backend::Postgres).await;
    let a = runtime(url.clone()).await;
    let b = runtime(url).await;
    for i in 0..100 {
        let s = Schedule::new(format!("s{i:03}"), "brief", "* * * * * *")
            .overlap(Overlap::Allow)
            .catch_up(agentsaga_saga::schedule::CatchUp::All { max: 100 });
        let by = if i % 2 == 0 { &a } else { &b };
        by.schedules().create(&s).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    for i in 0..100 {
        a.schedules().pause(&format!("s{i:03}")).await.unwrap();
    }
    let views = a.schedules().list().await.unwrap();
    let keys = agentsaga_core::Sql::new("SELECT key FROM saga_keys WHERE name = ?")
        .bind("brief")
        .fetch_all(a.store().reader())
        .await
        .unwrap();
    let mut slots: std::collections::HashMap<String, Vec<i64>> = Default::default();
    for r in &keys {
        let key = r.text("key").unwrap();
        let (name, slot) = key
            .strip_prefix("schedule:")
            .unwrap()
            .rsplit_once(':')
            .unwrap();
        slots
            .entry(name.to_owned())
            .or_default()
            .push(slot.parse().unwrap());
    }
    let mut total = 0;
    for v in &views {
        let mine = slots
            .get_mut(&v.schedule.name)
            .expect("every schedule fired");
        mine.sort_unstable();
        assert!(
            mine.len() >= 50,
            "{}: {} slots in a minute",
            v.schedule.name,
            mine.len()
        );
        for pair in mine.windows(2) {
            assert_eq!(pair[1] - pair[0], 1_000, "{}: a slot lost", v.schedule.name);
        }
        assert_eq!(
            v.fired,
            i64::try_from(mine.len()).unwrap(),
            "{}: fired twice",
            v.schedule.name
        );
        total += mine.len();
    }
    assert!(total >= 5_000, "{total} slots in a minute");
    eprintln!("{total} slots of 100 schedules, each fired once");
    a.shutdown().await;
    b.shutdown().await;
}

// A program declares its schedule at every start (`ensure`): the same schedule is left
// as it is, an operator's pause included; a changed one is replaced.
async fn ensure_keeps_what_an_operator_did(backend: Backend) {
    let rt = runtime(fresh_url(backend).await).await;
    let s = Schedule::new("daily", "brief", "0 7 * * *");
    let first = rt.schedules().ensure(&s).await.unwrap();
    rt.schedules().pause("daily").await.unwrap();
    let again = rt.schedules().ensure(&s).await.unwrap();
    assert!(again.schedule.paused, "an operator's pause is kept");
    assert_eq!(
        again.updated_ms,
        rt.schedules()
            .get("daily")
            .await
            .unwrap()
            .unwrap()
            .updated_ms
    );
    let eight = Schedule {
        cron: "0 8 * * *".into(),
        ..s.clone()
    };
    let changed = rt.schedules().ensure(&eight).await.unwrap();
    assert_eq!(changed.schedule.cron, "0 8 * * *");
    assert!(!changed.schedule.paused, "replaced, paused as declared");
    assert_ne!(changed.next_slot_ms, first.next_slot_ms);
    rt.shutdown().await;
}

both_backends!(ensure, ensure_keeps_what_an_operator_did);

/// How many sagas schedule `name` started (its start keys).
async fn fired(rt: &Runtime, name: &str) -> usize {
    agentsaga_core::Sql::new("SELECT count(*) AS n FROM saga_keys WHERE key LIKE ?")
        .bind(format!("schedule:{name}:%"))
        .fetch_one(rt.store().reader())
        .await
        .unwrap()
        .int("n")
        .map(|n| usize::try_from(n).unwrap())
        .unwrap()
}

// A process frozen (SIGSTOP) in the middle of firing a schedule holds that schedule's
// row lock, on PostgreSQL, for as long as it is frozen (here the test's own
// transaction holds it). Another process goes on firing every other schedule and runs
// its sagas meanwhile; the held schedule fires again once the lock is let go, each of
// its slots once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_of_a_schedule_stops_no_other() {
    use agentsaga_core::sqlx::{self, Connection as _};
    if !agentsaga_core::testing::backends().contains(&Backend::Postgres) {
        return; // a build without PostgreSQL
    }
    let url = fresh_url(Backend::Postgres).await;
    let rt = runtime(url.clone()).await;
    for name in ["held", "free"] {
        let s = Schedule::new(name, "brief", "* * * * * *").overlap(Overlap::Allow);
        rt.schedules().create(&s).await.unwrap();
    }
    wait_until("both fired", Duration::from_secs(20), async || {
        fired(&rt, "held").await > 0 && fired(&rt, "free").await > 0
    })
    .await;

    let mut frozen = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut frozen).await.unwrap();
    sqlx::query("SELECT name FROM saga_schedules WHERE name = 'held' FOR UPDATE")
        .execute(&mut frozen)
        .await
        .unwrap();
    let (held, free) = (fired(&rt, "held").await, fired(&rt, "free").await);
    wait_until(
        "the free schedule fires on while the other is held",
        Duration::from_secs(20),
        async || fired(&rt, "free").await >= free + 3,
    )
    .await;
    // The firing passes over the held one and does not spin on it.
    let firings = rt.schedules().fire_due().await.unwrap();
    // (The runtime's own firing task may hold `free` at that moment too.)
    assert!(firings.held >= 1, "{firings:?}");
    assert!(
        firings.next_in.unwrap() >= Duration::from_millis(200),
        "{firings:?}"
    );
    let id = rt.start_saga("brief", &json!({})).await.unwrap();
    wait_until(
        "a saga runs meanwhile",
        Duration::from_secs(20),
        async || query::get(rt.store(), id).await.unwrap().unwrap().state == SagaState::Completed,
    )
    .await;
    assert!(fired(&rt, "held").await <= held + 1, "held, it fired on");

    sqlx::query("ROLLBACK").execute(&mut frozen).await.unwrap();
    wait_until(
        "the held one fires again",
        Duration::from_secs(20),
        async || fired(&rt, "held").await >= held + 2,
    )
    .await;
    let views = rt.schedules().list().await.unwrap();
    for v in &views {
        let keys = fired(&rt, &v.schedule.name).await;
        assert_eq!(
            usize::try_from(v.fired).unwrap(),
            keys,
            "{}: a slot fired twice",
            v.schedule.name
        );
    }
    rt.shutdown().await;
}
