//! Deleting finished sagas (with their steps, dead letters and idempotency keys) in
//! short batches.

use agentsaga_core::{Sql, Store};
use serde::Serialize;

use super::fold_finished_counts;
use crate::Result;

/// What [`prune_finished`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Pruned {
    /// Finished sagas (with their steps).
    pub sagas: u64,
    /// Dead letters of those sagas.
    pub dead_letters: u64,
}

/// Sagas deleted per batch by [`prune_finished`]: each batch is two short statements.
const PRUNE_BATCH: i64 = 500;

/// Deletes the sagas that finished (completed, compensated or aborted) more than
/// `older_than` ago, with their steps, their dead letters and their idempotency keys
/// (a start with such a key afterwards starts a new saga), in batches of 500 (each
/// batch a short write: SQLite's write lock is never held long). Running and stuck
/// sagas are never touched, and a child saga is kept as long as its parent is (the
/// parent may yet turn back and undo it): it goes once its parent is gone.
///
/// # Errors
/// Store errors.
pub async fn prune_finished(store: &Store, older_than: std::time::Duration) -> Result<Pruned> {
    let older_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
    // The batch's sagas: the cutoff (an age, by the database's clock where it has
    // one), then the batch size.
    let pick = "SELECT id FROM saga_instances c
         WHERE state IN ('completed', 'compensated', 'aborted') AND finished_at < ?
           AND (parent_id IS NULL
                OR NOT EXISTS (SELECT 1 FROM saga_instances p WHERE p.id = c.parent_id))
         ORDER BY finished_at, id LIMIT ?";
    let delete_dead = format!(
        "DELETE FROM outbox WHERE state = 'dead'
           AND headers->>'saga_id' IN (SELECT CAST(id AS TEXT) FROM ({pick}) AS p)"
    );
    // Their idempotency keys go with them: a later start with one starts anew.
    let delete_keys = format!("DELETE FROM saga_keys WHERE saga_id IN ({pick})");
    let delete_sagas = format!("DELETE FROM saga_instances WHERE id IN ({pick})");
    let mut pruned = Pruned::default();
    loop {
        let run = |sql: &String| Sql::new(sql.clone()).bind_ago(older_ms).bind(PRUNE_BATCH);
        let mut tx = store.begin().await?;
        let dead = run(&delete_dead).execute(tx.conn()).await?;
        run(&delete_keys).execute(tx.conn()).await?;
        let sagas = run(&delete_sagas).execute(tx.conn()).await?;
        tx.commit().await?;
        pruned.sagas += sagas;
        pruned.dead_letters += dead;
        if sagas < PRUNE_BATCH as u64 {
            fold_finished_counts(store).await?;
            return Ok(pruned);
        }
    }
}
