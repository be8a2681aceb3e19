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
