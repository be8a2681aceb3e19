//! Counting sagas for the overview: per state (every saga, or through the state
//! index), the finished ones from the counts the database keeps, the stalled ones.

use std::str::FromStr;

use agentsaga_core::Store;
use agentsaga_core::sqlx;

use crate::{Error, Result, SagaState};

/// How many sagas are in each state.
///
/// # Errors
/// Store errors.
pub async fn count_by_state(store: &Store) -> Result<Vec<(SagaState, u64)>> {
    let rows: Vec<(String, i64)> = agentsaga_core::with_reader!(store.reader(), pool => {
        sqlx::query_as("SELECT state, count(*) FROM saga_instances GROUP BY state ORDER BY state")
            .fetch_all(pool)
            .await?
    });
    rows.into_iter()
        .map(|(s, n)| Ok((SagaState::from_str(&s).map_err(Error::Corrupt)?, n as u64)))
        .collect()
}

/// The finished sagas per final state (completed, compensated, aborted), read from
/// the counts the database keeps itself: `saga_finished_counts`, kept by triggers on
/// `saga_instances` in the transaction that finishes (or deletes) a saga, and on
/// PostgreSQL the `saga_finished_deltas` not yet folded into it
/// ([`fold_finished_counts`]). A few rows however many finished sagas are kept, and
/// exact at every commit.
///
/// # Errors
/// Store errors; [`Error::Corrupt`] for a negative count (the tables were written by
/// hand).
pub async fn count_finished(store: &Store) -> Result<Vec<(SagaState, u64)>> {
    let (completed, compensated, aborted): (i64, i64, i64) = agentsaga_core::match_reader!(store.reader(), sqlite(pool) => {
        sqlx::query_as(
            "SELECT CAST(coalesce(sum(completed), 0) AS BIGINT),
                        CAST(coalesce(sum(compensated), 0) AS BIGINT),
                        CAST(coalesce(sum(aborted), 0) AS BIGINT)
                 FROM saga_finished_counts",
        )
        .fetch_one(pool)
        .await?
    }, postgres(pool) => {
        sqlx::query_as(
            "SELECT CAST(coalesce(sum(completed), 0) AS BIGINT),
                        CAST(coalesce(sum(compensated), 0) AS BIGINT),
                        CAST(coalesce(sum(aborted), 0) AS BIGINT)
                 FROM (SELECT completed, compensated, aborted FROM saga_finished_counts
                       UNION ALL
                       SELECT completed, compensated, aborted FROM saga_finished_deltas) AS c",
        )
        .fetch_one(pool)
        .await?
    });
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

/// Folds PostgreSQL's `saga_finished_deltas` (a row per saga that finished or was
/// deleted, appended by the triggers) into `saga_finished_counts`, in one statement;
/// returns how many deltas it folded. Nothing to do on SQLite, whose triggers update
/// the counts directly (0). The runtime calls it every few seconds and
/// [`prune_finished`](super::prune_finished) after it deletes, so that [`count_finished`] reads few rows;
/// concurrent folds are safe (each delta is deleted, and counted, once).
///
/// # Errors
/// Store errors.
pub async fn fold_finished_counts(store: &Store) -> Result<u64> {
    let folded: i64 = agentsaga_core::match_reader!(store.reader(), sqlite(_pool) => {
        0
    }, postgres(pool) => {
        sqlx::query_scalar(
            "WITH d AS (DELETE FROM saga_finished_deltas
                        RETURNING completed, compensated, aborted),
                  s AS (SELECT count(*) AS n,
                               coalesce(sum(completed), 0) AS c,
                               coalesce(sum(compensated), 0) AS p,
                               coalesce(sum(aborted), 0) AS a FROM d),
                  u AS (UPDATE saga_finished_counts
                        SET completed = completed + s.c, compensated = compensated + s.p,
                            aborted = aborted + s.a
                        FROM s WHERE shard = 0 AND s.n > 0)
             SELECT n FROM s",
        )
        .fetch_one(pool)
        .await?
    });
    Ok(u64::try_from(folded).unwrap_or(0))
}

/// The sagas in each of `states`, each counted through the state index: cheap for
/// the few running, compensating or stuck sagas of a database that keeps many finished
/// ones (unlike [`count_by_state`], which reads every saga).
///
/// # Errors
/// Store errors.
pub async fn count_in_states(store: &Store, states: &[SagaState]) -> Result<Vec<(SagaState, u64)>> {
    let mut out = Vec::with_capacity(states.len());
    for state in states {
        let n: i64 = agentsaga_core::with_reader!(store.reader(), pool => {
            sqlx::query_scalar("SELECT count(*) FROM saga_instances WHERE state = $1")
                .bind(state.as_str())
                .fetch_one(pool)
                .await?
        });
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
    let before = agentsaga_core::clock::now_ms()
        - i64::try_from(no_progress_for.as_millis()).unwrap_or(i64::MAX / 2);
    let n: i64 = agentsaga_core::match_reader!(store.reader(), sqlite(reader) => {
        sqlx::query_scalar(
            "SELECT count(*) FROM saga_instances i
             WHERE (i.state = 'running' OR i.state = 'compensating')
               AND NOT EXISTS (SELECT 1 FROM saga_steps s WHERE s.saga_id = i.id
                   AND s.state = 'dispatched' AND s.destination LIKE 'signal:%')
               AND (i.updated_at < ?1 OR NOT EXISTS (
                   SELECT 1 FROM saga_steps s JOIN outbox o ON o.key = s.saga_id || ':' || s.idx
                   WHERE s.saga_id = i.id AND (o.state IN ('pending', 'in_flight')
                            OR (o.state = 'delivered' AND ((s.state = 'dispatched' AND o.id = s.command_id)
                                OR (s.compensation_state = 'dispatched' AND o.id = s.compensation_message_id))
                                AND NOT EXISTS (SELECT 1 FROM inbox n WHERE n.consumer = o.destination AND n.message_id = o.id)))))",
        )
        .bind(before)
        .fetch_one(reader)
        .await?
    }, postgres(pool) => {
        sqlx::query_scalar(
            "SELECT count(*) FROM saga_instances i
             WHERE (i.state = 'running' OR i.state = 'compensating')
               AND NOT EXISTS (SELECT 1 FROM saga_steps s WHERE s.saga_id = i.id
                   AND s.state = 'dispatched' AND s.destination LIKE 'signal:%')
               AND (i.updated_at < to_timestamp($1 / 1000.0) OR NOT EXISTS (
                   SELECT 1 FROM saga_steps s
                   JOIN outbox o ON o.key = s.saga_id::text || ':' || s.idx::text
                   WHERE s.saga_id = i.id AND (o.state IN ('pending', 'in_flight')
                            OR (o.state = 'delivered' AND ((s.state = 'dispatched' AND o.id = s.command_id)
                                OR (s.compensation_state = 'dispatched' AND o.id = s.compensation_message_id))
                                AND NOT EXISTS (SELECT 1 FROM inbox n WHERE n.consumer = o.destination AND n.message_id = o.id)))))",
        )
        .bind(before)
        .fetch_one(pool)
        .await?
    });
    Ok(u64::try_from(n).unwrap_or(0))
}
