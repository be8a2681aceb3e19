//! Counting sagas for the overview: per state (every saga, or through the state
//! index), the finished ones from the counts the database keeps, the stalled ones.

use std::str::FromStr;

use agentsaga_core::{Sql, Store};

use crate::{Error, Result, SagaState};

/// How many sagas are in each state.
///
/// # Errors
/// Store errors.
pub async fn count_by_state(store: &Store) -> Result<Vec<(SagaState, u64)>> {
    let rows =
        Sql::new("SELECT state, count(*) AS n FROM saga_instances GROUP BY state ORDER BY state")
            .fetch_all(store.reader())
            .await?;
    rows.iter()
        .map(|r| {
            let state = SagaState::from_str(&r.text("state")?).map_err(Error::Corrupt)?;
            Ok((state, r.int("n")?.max(0) as u64))
        })
        .collect()
}

/// The finished sagas per final state (completed, compensated, aborted), read from
/// the counts the database keeps itself: `saga_finished_counts`, kept by triggers on
/// `saga_instances` in the transaction that finishes (or deletes) a saga, and the
/// `saga_finished_deltas` not yet folded into it (PostgreSQL's; SQLite's stays empty)
/// ([`fold_finished_counts`]). A few rows however many finished sagas are kept, and
/// exact at every commit.
///
/// # Errors
/// Store errors; [`Error::Corrupt`] for a negative count (the tables were written by
/// hand).
pub async fn count_finished(store: &Store) -> Result<Vec<(SagaState, u64)>> {
    let row = Sql::new(
        "SELECT CAST(coalesce(sum(completed), 0) AS BIGINT) AS completed,
                CAST(coalesce(sum(compensated), 0) AS BIGINT) AS compensated,
                CAST(coalesce(sum(aborted), 0) AS BIGINT) AS aborted
         FROM (SELECT completed, compensated, aborted FROM saga_finished_counts
               UNION ALL
               SELECT completed, compensated, aborted FROM saga_finished_deltas) AS c",
    )
    .fetch_one(store.reader())
    .await?;
    let (completed, compensated, aborted) = (
        row.int("completed")?,
        row.int("compensated")?,
        row.int("aborted")?,
    );
    [
        (SagaState::Completed, completed),
        (SagaState::Compensated, compensated),
        (SagaState::Aborted, aborted),
    ]
    .into_iter()
    .map(|(state, n)| {
        u64::try_from(n)
            .map(|n| (state, n))
            .map_err(|_| Error::Corrupt(format!("saga_finished_counts: {n} {state} sagas")))
    })
    .collect()
}

/// Folds the `saga_finished_deltas` (a row per saga that finished or was deleted,
/// appended by PostgreSQL's triggers; SQLite's update the counts directly and leave it
/// empty) into `saga_finished_counts`, a chunk of them per transaction; returns how
/// many deltas it folded. The runtime calls it every few seconds and
/// [`prune_finished`](super::prune_finished) after it deletes, so that
/// [`count_finished`] reads few rows; concurrent folds are safe (each delta is
/// deleted, and counted, once).
///
/// # Errors
/// Store errors.
pub async fn fold_finished_counts(store: &Store) -> Result<u64> {
    let any = Sql::new("SELECT EXISTS (SELECT 1 FROM saga_finished_deltas) AS any")
        .fetch_one(store.reader())
        .await?
        .bool("any")?;
    if !any {
        return Ok(0);
    }
    let mut folded = 0;
    loop {
        // A chunk at a time, each in a transaction of its own: a bounded read and a
        // bounded set of row locks, however many deltas a prune appended.
        let mut tx = store.begin().await?;
        let deltas = Sql::new(
            "DELETE FROM saga_finished_deltas WHERE id IN
                 (SELECT id FROM saga_finished_deltas ORDER BY id LIMIT ?)
             RETURNING completed, compensated, aborted",
        )
        .bind(FOLD_CHUNK)
        .fetch_all(tx.conn())
        .await?;
        let mut sums = [0i64; 3];
        for d in &deltas {
            for (sum, column) in sums.iter_mut().zip(["completed", "compensated", "aborted"]) {
                *sum = sum.saturating_add(d.int(column)?);
            }
        }
        if !deltas.is_empty() {
            Sql::new(
                "UPDATE saga_finished_counts SET completed = completed + ?,
                    compensated = compensated + ?, aborted = aborted + ? WHERE shard = 0",
            )
            .bind(sums[0])
            .bind(sums[1])
            .bind(sums[2])
            .execute(tx.conn())
            .await?;
        }
        tx.commit().await?;
        folded += deltas.len() as u64;
        if (deltas.len() as i64) < FOLD_CHUNK {
            return Ok(folded);
        }
    }
}

/// Deltas folded per transaction.
const FOLD_CHUNK: i64 = 10_000;

/// The sagas in each of `states`, each counted through the state index: cheap for
/// the few running, compensating or stuck sagas of a database that keeps many finished
/// ones (unlike [`count_by_state`], which reads every saga).
///
/// # Errors
/// Store errors.
pub async fn count_in_states(store: &Store, states: &[SagaState]) -> Result<Vec<(SagaState, u64)>> {
    let mut out = Vec::with_capacity(states.len());
    for state in states {
        let n = Sql::new("SELECT count(*) AS n FROM saga_instances WHERE state = ?")
            .bind(state.as_str())
            .fetch_one(store.reader())
            .await?
            .int("n")?;
        out.push((*state, u64::try_from(n).unwrap_or(0)));
    }
    Ok(out)
}

/// How many sagas [`stalled`](super::stalled) would list (without its limit), reading only running
/// and compensating sagas (through the state index).
///
/// # Errors
/// Store errors.
pub async fn count_stalled(store: &Store, no_progress_for: std::time::Duration) -> Result<u64> {
    let before =
        store.clock().now_ms() - i64::try_from(no_progress_for.as_millis()).unwrap_or(i64::MAX / 2);
    let n = Sql::new(
        "SELECT count(*) AS n FROM saga_instances i
         WHERE (i.state = 'running' OR i.state = 'compensating')
           -- paused: an operator holds it
           AND i.pause IS NULL
           AND NOT EXISTS (SELECT 1 FROM saga_steps s WHERE s.saga_id = i.id
               AND s.state = 'dispatched' AND s.destination LIKE 'signal:%')
           -- asleep: a running saga whose steps on their way are all sleeps
           AND NOT (i.state = 'running'
               AND EXISTS (SELECT 1 FROM saga_steps s WHERE s.saga_id = i.id
                   AND s.state = 'dispatched' AND s.destination LIKE 'sleep:%')
               AND NOT EXISTS (SELECT 1 FROM saga_steps s WHERE s.saga_id = i.id
                   AND s.state = 'dispatched' AND s.destination NOT LIKE 'sleep:%'))
           AND (i.updated_at < ? OR NOT EXISTS (
               SELECT 1 FROM saga_steps s
               JOIN outbox o ON o.key = CAST(s.saga_id AS TEXT) || ':' || CAST(s.idx AS TEXT)
               WHERE s.saga_id = i.id AND (o.state IN ('pending', 'in_flight')
                        OR (o.state = 'delivered' AND ((s.state = 'dispatched' AND o.id = s.command_id)
                            OR (s.compensation_state = 'dispatched' AND o.id = s.compensation_message_id))
                            AND NOT EXISTS (SELECT 1 FROM inbox n WHERE n.consumer = o.destination AND n.message_id = o.id)))))",
    )
    .bind_time(before)
    .fetch_one(store.reader())
    .await?
    .int("n")?;
    Ok(u64::try_from(n).unwrap_or(0))
}
