//! Schedules against a store, on both backends: each slot starts one saga under its
//! start key, whoever fires it and however often; the catch-up and overlap policies
//! exactly; a saga that cannot start is no silent drop. Downtime is made by moving a
//! schedule's next slot back, as a process down since then would have left it.

use super::sleeps::{answer, orchestrate};
use super::*;
use crate::schedule::{self, CatchUp, Overlap, Schedule};

mod faults;

const HOUR: i64 = 3_600_000;

fn brief() -> SagaDefinition {
    Saga::<D>::builder("brief", 1)
        .pivot(Step::new("draft", "writer"))
        .build()
        .unwrap()
}

/// An hourly expression whose latest time is about half an hour ago (never within a
/// few minutes of now), and that time.
fn hourly() -> (String, i64) {
    let now = agentsaga_core::clock::system_now_ms();
    let minute = (now / 60_000 + 30) % 60;
    let latest = (now - 30 * 60_000) / 60_000 * 60_000;
    (format!("{minute} * * * *"), latest)
}

/// Moves schedule `name` back to the slot `slot`, as if no process had fired it since.
async fn down_since(store: &Store, name: &str, slot: i64) {
    let mut tx = store.begin().await.unwrap();
    agentsaga_core::Sql::new(
        "UPDATE saga_schedules SET next_slot_ms = ?, next_due_ms = ? WHERE name = ?",
    )
    .bind(slot)
    .bind(slot)
    .bind(name)
    .execute(tx.conn())
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

/// The slots of schedule `name` that started a saga, from the start keys.
async fn started_slots(store: &Store, name: &str) -> Vec<i64> {
    let prefix = format!("schedule:{name}:");
    let rows = agentsaga_core::Sql::new("SELECT key FROM saga_keys WHERE name = ? ORDER BY key")
        .bind("brief")
        .fetch_all(store.reader())
        .await
        .unwrap();
    let mut slots: Vec<i64> = rows
        .iter()
        .filter_map(|r| r.text("key").unwrap().strip_prefix(&prefix)?.parse().ok())
        .collect();
    slots.sort_unstable();
    slots
}

// A process down for five hours comes back: each catch-up policy fires exactly the
// slots it names, each once, with the slot's time in the saga's input; firing again
// fires nothing, and the schedule goes on from its next slot.
async fn catch_up_after_downtime_is_exact(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let engine = Engine::new(vec![brief()]).unwrap();
    let (cron, latest) = hourly();
    let cases = [
        (CatchUp::None, vec![]),
        (CatchUp::Latest, vec![latest]),
        (
            CatchUp::All { max: 3 },
            vec![latest - 2 * HOUR, latest - HOUR, latest],
        ),
        (
            CatchUp::All { max: 100 },
            (0..6).rev().map(|h| latest - h * HOUR).collect(),
        ),
    ];
    for (i, (catch_up, expected)) in cases.into_iter().enumerate() {
        let name = format!("c{i}");
        let s = Schedule::new(&name, "brief", &cron)
            .input(json!({ "at": { "$fire_time": "unix_ms" } }))
            .catch_up(catch_up)
            .overlap(Overlap::Allow);
        engine.check_schedule(&store, &s).unwrap();
        let created = schedule::create(&store, &s).await.unwrap();
        assert_eq!(created.next_slot_ms, Some(latest + HOUR), "{catch_up}");
        down_since(&store, &name, latest - 5 * HOUR).await;
        let firings = engine.fire_schedules(&store).await.unwrap();
        let mut fired: Vec<i64> = firings.fired.iter().map(|f| f.slot_ms).collect();
        fired.sort_unstable();
        assert_eq!(fired, expected, "{catch_up}");
        assert_eq!(started_slots(&store, &name).await, expected, "{catch_up}");
        for f in &firings.fired {
            let data = query::data(&store, f.saga_id).await.unwrap().unwrap();
            assert_eq!(
                data["at"],
                json!(f.slot_ms),
                "the template receives the slot"
            );
        }
        let again = engine.fire_schedules(&store).await.unwrap();
        assert!(again.fired.is_empty(), "{catch_up}: {again:?}");
        let view = schedule::get(&store, &name).await.unwrap().unwrap();
        assert_eq!(view.next_slot_ms, Some(latest + HOUR));
        assert_eq!(view.fired, i64::try_from(expected.len()).unwrap());
        assert_eq!(view.last_slot_ms, expected.last().copied());
        assert!(
            again
                .next_in
                .is_some_and(|d| d > Duration::from_secs(20 * 60))
        );
        // Fired again from its old slot (a crash after the starts, before the row
        // moved, would leave it so): the slots' keys start nothing twice, and a
        // repeat is not counted as a firing.
        if !expected.is_empty() {
            down_since(&store, &name, latest - 5 * HOUR).await;
            let repeat = engine.fire_schedules(&store).await.unwrap();
            assert!(repeat.fired.is_empty(), "{catch_up}: {repeat:?}");
            assert_eq!(started_slots(&store, &name).await, expected);
            let after = schedule::get(&store, &name).await.unwrap().unwrap();
            assert_eq!(
                (after.fired, after.last_saga_id),
                (view.fired, view.last_saga_id)
            );
        }
        schedule::delete(&store, &name).await.unwrap();
    }
}

both_backends!(catch_up, catch_up_after_downtime_is_exact);

// Overlap: three slots due while the previous firing's saga runs. Skip fires the
// first and skips the rest; queue-one keeps the last and fires it when that saga
// ends; allow starts all three.
async fn overlap_policies(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let engine = Engine::new(vec![brief()]).unwrap();
    let (cron, latest) = hourly();
    let three = [latest - 2 * HOUR, latest - HOUR, latest];
    for (name, overlap) in [
        ("skip", Overlap::Skip),
        ("queue", Overlap::QueueOne),
        ("allow", Overlap::Allow),
    ] {
        let s = Schedule::new(name, "brief", &cron)
            .overlap(overlap)
            .catch_up(CatchUp::All { max: 10 });
        schedule::create(&store, &s).await.unwrap();
        down_since(&store, name, three[0]).await;
        let firings = engine.fire_schedules(&store).await.unwrap();
        let fired: Vec<i64> = firings.fired.iter().map(|f| f.slot_ms).collect();
        let view = schedule::get(&store, name).await.unwrap().unwrap();
        match overlap {
            Overlap::Skip => {
                assert_eq!(fired, [three[0]]);
                assert_eq!((view.skipped, view.queued_slot_ms), (2, None));
            }
            Overlap::QueueOne => {
                assert_eq!(fired, [three[0]]);
                assert_eq!((view.skipped, view.queued_slot_ms), (1, Some(three[2])));
                // Still running: the queued slot waits.
                assert!(
                    engine
                        .fire_schedules(&store)
                        .await
                        .unwrap()
                        .fired
                        .is_empty()
                );
                // The saga ends; the queued slot fires, once.
                // (The skip case's saga runs too: both are answered.)
                assert_eq!(answer(&store, "writer").await, 2);
                orchestrate(&engine, &store, "brief").await;
                let s = query::get(&store, firings.fired[0].saga_id)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(s.state, SagaState::Completed);
                let next = engine.fire_schedules(&store).await.unwrap();
                let fired: Vec<i64> = next.fired.iter().map(|f| f.slot_ms).collect();
                assert_eq!(fired, [three[2]]);
                let view = schedule::get(&store, name).await.unwrap().unwrap();
                assert_eq!((view.fired, view.queued_slot_ms), (2, None));
                assert!(
                    engine
                        .fire_schedules(&store)
                        .await
                        .unwrap()
                        .fired
                        .is_empty()
                );
            }
            Overlap::Allow => {
                assert_eq!(fired, three);
                assert_eq!(view.skipped, 0);
            }
        }
        schedule::delete(&store, name).await.unwrap();
    }
}

both_backends!(overlap, overlap_policies);

// Two engines on one database (two processes) fire the same due schedules at once:
// each slot starts exactly one saga.
async fn two_processes_fire_each_slot_once(backend: Backend) {
    let url = fresh_url(backend).await;
    let a = Store::connect(&url).await.unwrap();
    let b = Store::connect(&url).await.unwrap();
    let engine = Engine::new(vec![brief()]).unwrap();
    let (cron, latest) = hourly();
    for i in 0..10 {
        let s = Schedule::new(format!("s{i}"), "brief", &cron)
            .overlap(Overlap::Allow)
            .catch_up(CatchUp::All { max: 10 });
        schedule::create(&a, &s).await.unwrap();
        down_since(&a, &format!("s{i}"), latest - 3 * HOUR).await;
    }
    let (x, y) = tokio::join!(engine.fire_schedules(&a), engine.fire_schedules(&b));
    let (x, y) = (x.unwrap(), y.unwrap());
    let ids: HashSet<SagaId> = x.fired.iter().chain(&y.fired).map(|f| f.saga_id).collect();
    assert_eq!(ids.len(), 40, "4 slots of 10 schedules, one saga each");
    for i in 0..10 {
        let name = format!("s{i}");
        let expected: Vec<i64> = (0..4).rev().map(|h| latest - h * HOUR).collect();
        assert_eq!(started_slots(&a, &name).await, expected);
        assert_eq!(schedule::get(&a, &name).await.unwrap().unwrap().fired, 4);
    }
    let sagas = query::list(
        &a,
        &query::ListFilter {
            limit: 1000,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(sagas.len(), 40);
}

both_backends!(two_processes, two_processes_fire_each_slot_once);

#[derive(serde::Serialize, serde::Deserialize)]
struct Typed {
    topic: String,
}

// A schedule whose input its saga refuses is refused by the engine's check; stored
// anyway (by the CLI, say), its firing starts nothing, keeps why, counts the slot as
// skipped and goes on to the next slot: no silent drop, no firing loop.
async fn a_firing_that_cannot_start_keeps_its_reason(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let typed = Saga::<Typed>::builder("typed", 1)
        .pivot(Step::new("draft", "writer"))
        .build()
        .unwrap();
    let engine = Engine::new(vec![typed, brief()]).unwrap();
    let (cron, latest) = hourly();
    let bad = Schedule::new("bad", "typed", &cron)
        .input(json!({ "nope": 1 }))
        .catch_up(CatchUp::Latest);
    let e = engine.check_schedule(&store, &bad).unwrap_err();
    assert!(matches!(e, Error::InvalidSchedule { .. }), "{e}");
    let unknown = Schedule::new("unknown", "nowhere", &cron);
    assert!(
        engine
            .check_schedule(&store, &unknown)
            .unwrap_err()
            .to_string()
            .contains("nowhere")
    );
    // A schedule of a saga this engine does not have is another process's: left
    // alone, due, neither fired nor skipped.
    schedule::create(&store, &unknown.clone().catch_up(CatchUp::Latest))
        .await
        .unwrap();
    down_since(&store, "unknown", latest).await;
    schedule::create(&store, &bad).await.unwrap();
    assert!(matches!(
        schedule::create(&store, &bad).await.unwrap_err(),
        Error::ScheduleExists(_)
    ));
    down_since(&store, "bad", latest).await;
    let firings = engine.fire_schedules(&store).await.unwrap();
    assert!(firings.fired.is_empty());
    assert_eq!(firings.failed.len(), 1);
    let view = schedule::get(&store, "bad").await.unwrap().unwrap();
    assert_eq!((view.skipped, view.fired), (1, 0));
    assert!(
        view.last_error
            .as_deref()
            .is_some_and(|e| e.contains("typed")),
        "{view:?}"
    );
    assert_eq!(view.next_slot_ms, Some(latest + HOUR));
    assert!(started_slots(&store, "bad").await.is_empty());
    let theirs = schedule::get(&store, "unknown").await.unwrap().unwrap();
    assert_eq!(
        (theirs.fired, theirs.skipped, theirs.next_slot_ms),
        (0, 0, Some(latest))
    );
    // Mended with `put`, it fires; the error is cleared by a firing that starts.
    let good = bad.clone().input(json!({ "topic": "news" }));
    engine.check_schedule(&store, &good).unwrap();
    schedule::put(&store, &good).await.unwrap();
    down_since(&store, "bad", latest).await;
    assert_eq!(engine.fire_schedules(&store).await.unwrap().fired.len(), 1);
    let view = schedule::get(&store, "bad").await.unwrap().unwrap();
    assert_eq!((view.fired, view.skipped, view.last_error), (1, 1, None));
}

both_backends!(cannot_start, a_firing_that_cannot_start_keeps_its_reason);

// Paused, a schedule fires nothing however late; resumed, it goes on from its next
// slot after now (what it slept through is not caught up). Deleted, it is gone and
// its sagas stay.
async fn pause_resume_delete(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let engine = Engine::new(vec![brief()]).unwrap();
    let (cron, latest) = hourly();
    let s = Schedule::new("p", "brief", &cron).catch_up(CatchUp::All { max: 10 });
    schedule::create(&store, &s).await.unwrap();
    assert!(schedule::pause(&store, "p").await.unwrap().schedule.paused);
    down_since(&store, "p", latest - HOUR).await;
    assert!(
        engine
            .fire_schedules(&store)
            .await
            .unwrap()
            .fired
            .is_empty()
    );
    let resumed = schedule::resume(&store, "p").await.unwrap();
    assert!(!resumed.schedule.paused);
    assert_eq!(resumed.next_slot_ms, Some(latest + HOUR));
    assert!(
        engine
            .fire_schedules(&store)
            .await
            .unwrap()
            .fired
            .is_empty()
    );
    assert!(matches!(
        schedule::pause(&store, "nothing").await.unwrap_err(),
        Error::NoSchedule(_)
    ));
    let all = schedule::list(&store).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].schedule, s);
    assert!(schedule::delete(&store, "p").await.unwrap());
    assert!(!schedule::delete(&store, "p").await.unwrap());
    assert!(schedule::get(&store, "p").await.unwrap().is_none());
}

both_backends!(pause_resume, pause_resume_delete);

// Jitter: each slot fires up to its bound after its time, and only then; the slot (its
// start key) stays the calendar's.
async fn jitter_delays_a_slot_within_its_bound(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await).await.unwrap();
    let engine = Engine::new(vec![brief()]).unwrap();
    let (cron, latest) = hourly();
    let s = Schedule::new("j", "brief", &cron)
        .jitter(Duration::from_secs(1_000))
        .catch_up(CatchUp::Latest);
    let mut delays = HashSet::new();
    for _ in 0..8 {
        let v = schedule::put(&store, &s).await.unwrap();
        let (slot, due) = (v.next_slot_ms.unwrap(), v.next_due_ms.unwrap());
        assert_eq!(slot, latest + HOUR);
        assert!(
            (0..=1_000_000).contains(&(due - slot)),
            "{slot} due at {due}"
        );
        delays.insert(due - slot);
    }
    assert!(delays.len() > 1, "a jitter drawn anew: {delays:?}");
    // Due in the future: not fired, though its slot has passed.
    let mut tx = store.begin().await.unwrap();
    agentsaga_core::Sql::new("UPDATE saga_schedules SET next_slot_ms = ?, next_due_ms = ?")
        .bind(latest)
        .bind(agentsaga_core::clock::system_now_ms() + 60_000)
        .execute(tx.conn())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(
        engine
            .fire_schedules(&store)
            .await
            .unwrap()
            .fired
            .is_empty()
    );
    down_since(&store, "j", latest).await;
    let fired = engine.fire_schedules(&store).await.unwrap().fired;
    assert_eq!(
        fired.iter().map(|f| f.slot_ms).collect::<Vec<_>>(),
        [latest]
    );
}

both_backends!(jitter, jitter_delays_a_slot_within_its_bound);
