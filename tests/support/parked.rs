//! What waits in a database: sagas asleep, starts waiting for room.

use agentsaga::core::Store;

/// The sagas parked at a sleep.
pub(crate) async fn asleep(store: &Store) -> usize {
    let filter = agentsaga::saga::query::ListFilter {
        sleeping: true,
        limit: 1000,
        ..Default::default()
    };
    agentsaga::saga::query::list(store, &filter)
        .await
        .unwrap()
        .len()
}

/// The starts waiting for room in `saga_starts`, of every saga name.
pub(crate) async fn waiting_starts(store: &Store) -> u64 {
    agentsaga::saga::Engine::waiting_starts(store)
        .await
        .unwrap()
        .iter()
        .map(|(_, n)| n)
        .sum()
}
