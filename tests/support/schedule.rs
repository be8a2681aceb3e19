//! The reconciliation schedule of `trip_booking --schedule` as the tests check it:
//! every slot from the first fired to the last started exactly one `reconcile` saga
//! (its start key `schedule:reconcile:<slot ms>`), and each recorded reconciliation is
//! of one of those sagas, once.

use std::collections::{BTreeSet, HashMap};

use agentsaga::core::{Sql, Store};

/// The slots that started a saga, and how many reconciliations were recorded. Panics
/// unless the slots are consecutive `step_ms` apart and every recorded reconciliation
/// is one saga's, once, for its own slot.
pub(crate) async fn check_slots(store: &Store, step_ms: i64) -> (usize, usize) {
    let keys = Sql::new("SELECT key, saga_id FROM saga_keys WHERE name = ?")
        .bind("reconcile")
        .fetch_all(store.reader())
        .await
        .unwrap();
    let mut slot_of = HashMap::new();
    let mut slots = BTreeSet::new();
    for r in &keys {
        let key = r.text("key").unwrap();
        let slot: i64 = key
            .strip_prefix("schedule:reconcile:")
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("a reconcile saga started by hand: {key}"));
        assert!(slots.insert(slot), "slot {slot} twice");
        slot_of.insert(r.uuid("saga_id").unwrap().to_string(), slot);
    }
    let slots: Vec<i64> = slots.into_iter().collect();
    assert!(!slots.is_empty(), "the schedule never fired");
    for pair in slots.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            step_ms,
            "a slot lost between {pair:?}: {slots:?}"
        );
    }
    let rows = Sql::new("SELECT saga_id, slot_ms FROM trip_reconciliations")
        .fetch_all(store.reader())
        .await
        .unwrap();
    for r in &rows {
        let saga = r.text("saga_id").unwrap();
        let slot: i64 = r.text("slot_ms").unwrap().parse().unwrap();
        assert_eq!(
            slot_of.get(&saga),
            Some(&slot),
            "reconciliation of saga {saga}"
        );
    }
    (slots.len(), rows.len())
}

/// `trip_booking --schedule` as the README shows it, on the database at `url`: the
/// reconciliations run on their own beside the trips, each slot one saga.
pub(crate) async fn reconciles_beside_the_trips(url: String) {
    let args = [
        "--sagas",
        "20",
        "--schedule",
        "* * * * * *",
        "--reconciliations",
        "3",
    ];
    let out = crate::support::run("trip_booking", &url, &args);
    assert!(out.contains("reconciliations        : "), "{out}");
    let store = Store::connect(&url).await.unwrap();
    let (slots, rows) = check_slots(&store, 1_000).await;
    assert!(
        rows >= 3 && slots >= rows,
        "{slots} slots, {rows} rows: {out}"
    );
}

/// The SQLite database at `url`: a `trip_booking --schedule` every minute whose
/// process's clock is stepped two and a half hours ahead (the test hook `clock::step`)
/// right after it declared the schedule: the time it "was down" is caught up exactly as
/// the example's policy says (the latest 100 missed slots and the one in time), each
/// slot once, a minute apart, up to the last before the stepped clock.
pub(crate) async fn an_hour_ahead_catches_up(url: String) {
    use std::time::Duration;
    let clock = crate::support::clock::clock_file(&url);
    crate::support::clock::step_clock(&clock, 0);
    let store = Store::connect(&url).await.unwrap();
    let args = [
        "--sagas",
        "0",
        "--schedule",
        "0 * * * * *",
        "--reconciliations",
        "1",
    ];
    let child = crate::support::spawn_with("trip_booking", &url, &args, |cmd| {
        cmd.env(agentsaga::core::clock::step::VAR, &clock);
    });
    let declared = async || {
        let view = agentsaga::saga::schedule::get(&store, "reconcile")
            .await
            .unwrap();
        view.and_then(|v| v.next_slot_ms)
    };
    let mut first = None;
    for _ in 0..600 {
        first = declared().await;
        if first.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Some(first) = first else {
        let out = crate::support::wait_bounded(child, Duration::from_secs(1));
        panic!(
            "the schedule was not declared: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ahead = 150 * 60_000;
    crate::support::clock::step_clock(&clock, ahead);
    let stepped_at = agentsaga::core::clock::system_now_ms() + ahead;
    let out = tokio::task::spawn_blocking(move || {
        crate::support::wait_bounded(child, Duration::from_secs(120))
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (slots, rows) = check_slots(&store, 60_000).await;
    // The last minute mark is in time (under `late_after`, a minute, past it); the
    // 149 before it were missed: the latest 100 of them fire (`CatchUp::All { max:
    // 100 }`), the older ones do not.
    let last = stepped_at / 60_000 * 60_000;
    let all = (last - first) / 60_000 + 1;
    let expected = usize::try_from((all - 1).min(100) + 1).unwrap();
    assert!(
        (expected..=expected + 1).contains(&slots),
        "{slots} slots, {expected} expected of {all}"
    );
    assert_eq!(rows, slots, "each caught-up slot reconciled once");
    eprintln!(
        "clock stepped 150 min ahead: {slots} of {all} slots fired, the latest, one minute apart, each once"
    );
}
