//! The finished sagas' counts: PostgreSQL's triggers append a delta per saga that
//! finishes (or is deleted), and this task folds them into `saga_finished_counts`
//! every few seconds ([`agentsaga_saga::query::fold_finished_counts`]), so that the
//! overview (`agentsaga status`, the console) sums few rows. SQLite's triggers update
//! the counts directly: a fold there reads that nothing waits and writes nothing. Any
//! process may fold; folds never count a delta twice.

use std::time::Duration;

use agentsaga_core::Store;
use agentsaga_saga::query;
use tokio::task::JoinHandle;

/// How often the deltas are folded.
const EVERY: Duration = Duration::from_secs(5);

/// Folds every [`EVERY`] until aborted (a failed fold is tried again at the next tick:
/// the deltas wait, and are read by the overview meanwhile).
pub(crate) fn spawn(store: Store) -> Option<JoinHandle<()>> {
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = query::fold_finished_counts(&store).await {
                tracing::debug!(error = %e, "folding the finished sagas' counts failed");
            }
        }
    }))
}
