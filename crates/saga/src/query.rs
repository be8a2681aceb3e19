//! Reading sagas back: for `wait`, for operators and for the CLI.

use std::str::FromStr;

use agentsaga_core::Store;
use agentsaga_core::sqlx::{self, Row};
use serde::Serialize;

use crate::{CompensationState, Error, Result, SagaId, SagaState, StepState};

mod counts;
mod prune;
mod spending;

pub use counts::{
    count_by_state, count_finished, count_in_states, count_stalled, fold_finished_counts,
};
pub use prune::{Pruned, prune_finished};
pub use spending::{Spending, spending};

/// One saga instance, as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SagaSummary {
    /// Its id.
    pub id: SagaId,
    /// Saga name.
    pub name: String,
    /// Definition version.
    pub version: i32,
    /// Lifecycle state.
    pub state: SagaState,
    /// The last error, if any.
    pub error: Option<String>,
    /// The caller's idempotency key it was started with, if any.
    pub key: Option<String>,
    /// The signal it waits for now (`Step::wait_for`), if it is parked at a wait.
    pub waiting_for: Option<String>,
    /// The saga whose step started it, for a child saga (`Step::saga`).
    pub parent_id: Option<SagaId>,
    /// Created, Unix ms.
    pub created_at_ms: i64,
    /// Last change, Unix ms.
    pub updated_at_ms: i64,
}

/// One step of a saga with its compensation-ledger entry, as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepView {
    /// Index in the saga.
    pub idx: i64,
    /// Parallel group (stage) index.
    pub stage: i64,
    /// Step name.
    pub name: String,
    /// Agent destination.
    pub destination: String,
    /// Where the forward step stands.
    pub state: StepState,
    /// Dispatches so far.
    pub attempts: i64,
    /// Last error.
    pub error: Option<String>,
    /// Compensation destination (the ledger).
    pub compensation_destination: Option<String>,
    /// Compensation payload (JSON text).
    pub compensation_payload: Option<String>,
    /// Where its compensation stands (`None`: nothing to undo yet).
    pub compensation_state: Option<CompensationState>,
    /// Compensation dispatches so far.
    pub compensation_attempts: i64,
    /// Last compensation error.
    pub compensation_error: Option<String>,
    /// Unix ms.
    pub dispatched_at_ms: Option<i64>,
    /// Unix ms.
    pub replied_at_ms: Option<i64>,
    /// Unix ms.
    pub compensated_at_ms: Option<i64>,
    /// What its attempts and its compensation used, as their agents reported it.
    pub usage: crate::Usage,
}

fn summary(id: SagaId, r: &impl SummaryRow) -> Result<SagaSummary> {
    r.summary(id)
}

trait SummaryRow {
    fn summary(&self, id: SagaId) -> Result<SagaSummary>;
}

macro_rules! impl_summary {
    ($row:ty, $version:ty) => {
        impl SummaryRow for $row {
            fn summary(&self, id: SagaId) -> Result<SagaSummary> {
                let state: String = self.try_get("state")?;
                Ok(SagaSummary {
                    id,
                    name: self.try_get("name")?,
                    version: self.try_get::<$version, _>("version")? as i32,
                    state: SagaState::from_str(&state).map_err(Error::Corrupt)?,
                    error: self.try_get("error")?,
                    key: self.try_get("key")?,
                    waiting_for: self.try_get("waiting_for")?,
                    parent_id: self
                        .try_get::<Option<String>, _>("parent_id")?
                        .map(|p| parse_id(&p))
                        .transpose()?,
                    created_at_ms: self.try_get("created_at")?,
                    updated_at_ms: self.try_get("updated_at")?,
                })
            }
        }
    };
}
agentsaga_core::if_sqlite! {
    impl_summary!(sqlx::sqlite::SqliteRow, i64);
}
agentsaga_core::if_postgres! {
    impl_summary!(sqlx::postgres::PgRow, i32);
}

fn parse_id(s: &str) -> Result<SagaId> {
    s.parse()
        .map_err(|e| Error::Corrupt(format!("saga id `{s}`: {e}")))
}

/// Filter for [`list`].
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this state.
    pub state: Option<SagaState>,
    /// Only this saga name.
    pub name: Option<String>,
    /// Only the saga started with this idempotency key.
    pub key: Option<String>,
    /// Only sagas parked at a wait for a signal.
    pub waiting: bool,
    /// Only the child sagas of this saga (`Step::saga`).
    pub parent: Option<SagaId>,
    /// Only stalled sagas ([`stalled`]), with this threshold of no progress.
    pub stalled: Option<std::time::Duration>,
    /// Only sagas created at or after this Unix ms.
    pub created_from_ms: Option<i64>,
    /// Only sagas created before this Unix ms.
    pub created_to_ms: Option<i64>,
    /// The page after this cursor (the [`Cursor`] of the last saga of the previous
    /// page).
    pub after: Option<Cursor>,
    /// At most this many (newest first). 0 means 100.
    pub limit: u32,
}

/// Where a page of [`list`] ends: the last saga's creation time and id (the list is
/// ordered by both, newest first). As text, `<created_ms>.<id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The saga's creation, Unix ms.
    pub created_at_ms: i64,
    /// The saga's id.
    pub id: SagaId,
}

impl Cursor {
    /// The cursor after `s`.
    pub fn after(s: &SagaSummary) -> Self {
        Self {
            created_at_ms: s.created_at_ms,
            id: s.id,
        }
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.created_at_ms, self.id)
    }
}

impl FromStr for Cursor {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || format!("`{s}` is not a cursor (`<created_ms>.<saga id>`)");
        let (ms, id) = s.split_once('.').ok_or_else(bad)?;
        Ok(Self {
            created_at_ms: ms.parse().map_err(|_| bad())?,
            id: id.parse().map_err(|_| bad())?,
        })
    }
}

/// What makes a saga stalled: it is running or compensating, not parked at a wait, and
/// either nothing is pending or in flight for any of its steps (no command, reply or
/// compensation in the outbox: nothing will move it), or it has made no progress for
/// longer than `no_progress_for`. A live step (or compensation) whose message was
/// delivered and not received here (not in this database's inbox: it went to an agent
/// in another service, over NATS or HTTP) counts as something on its way, its answer
/// awaited: such a saga is stalled only past `no_progress_for`. (Received here, its
/// answer came in the same transaction: if the saga did not move, it was lost.) A saga whose only live message is a keyless timer
/// (its deadline) counts as stalled by the first rule: its deadline is then the only
/// thing that will move it. One query, by the `saga_instances` state index, then the
/// steps' primary key and the outbox's key index.
///
/// # Errors
/// Store errors.
pub async fn stalled(
    store: &Store,
    no_progress_for: std::time::Duration,
    limit: u32,
) -> Result<Vec<SagaSummary>> {
    list(
        store,
        &ListFilter {
            stalled: Some(no_progress_for),
            limit,
            ..ListFilter::default()
        },
    )
    .await
}

/// One saga's summary.
///
/// # Errors
/// Store errors.
pub async fn get(store: &Store, id: SagaId) -> Result<Option<SagaSummary>> {
    let mut l = list_inner(store, Some(id), &ListFilter::default()).await?;
    Ok(l.pop())
}

/// Sagas, newest first.
///
/// # Errors
/// Store errors.
pub async fn list(store: &Store, filter: &ListFilter) -> Result<Vec<SagaSummary>> {
    list_inner(store, None, filter).await
}

async fn list_inner(store: &Store, id: Option<SagaId>, f: &ListFilter) -> Result<Vec<SagaSummary>> {
    let limit = i64::from(if f.limit == 0 { 100 } else { f.limit });
    let state = f.state.map(SagaState::as_str);
    // Stalled: no progress since this Unix ms (or nothing live for its steps).
    let stalled_before: Option<i64> = f.stalled.map(|t| {
        agentsaga_core::clock::now_ms() - i64::try_from(t.as_millis()).unwrap_or(i64::MAX / 2)
    });
    agentsaga_core::match_reader!(store.reader(), sqlite(reader) => {
        let rows = sqlx::query(
            "SELECT * FROM (SELECT i.id, i.name, i.version, i.state, i.error, k.key,
                    i.parent_id, i.created_at, i.updated_at, (SELECT substr(s.destination, 8) FROM saga_steps s WHERE s.saga_id = i.id AND s.state = 'dispatched' AND s.destination LIKE 'signal:%' ORDER BY s.idx LIMIT 1) AS waiting_for
                 FROM saga_instances i LEFT JOIN saga_keys k ON k.saga_id = i.id
                 WHERE (?1 IS NULL OR i.id = ?1) AND (?2 IS NULL OR i.state = ?2)
                   AND (?3 IS NULL OR i.name = ?3) AND (?5 IS NULL OR k.key = ?5)
                   AND (?7 IS NULL OR i.state IN ('running', 'compensating'))
                   AND (?8 IS NULL OR i.created_at >= ?8) AND (?9 IS NULL OR i.created_at < ?9)
                   AND (?10 IS NULL OR i.created_at < ?10 OR (i.created_at = ?10 AND i.id < ?11))
                   AND (?12 IS NULL OR i.parent_id = ?12)) AS v
                 WHERE (NOT ?6 OR v.waiting_for IS NOT NULL)
                   AND (?7 IS NULL OR (v.waiting_for IS NULL AND (v.updated_at < ?7 OR NOT EXISTS (
                        SELECT 1 FROM saga_steps s JOIN outbox o ON o.key = s.saga_id || ':' || s.idx
                        WHERE s.saga_id = v.id AND (o.state IN ('pending', 'in_flight')
                            OR (o.state = 'delivered' AND ((s.state = 'dispatched' AND o.id = s.command_id)
                                OR (s.compensation_state = 'dispatched' AND o.id = s.compensation_message_id))
                                AND NOT EXISTS (SELECT 1 FROM inbox n WHERE n.consumer = o.destination AND n.message_id = o.id)))))))
                 ORDER BY v.created_at DESC, v.id DESC LIMIT ?4",
        )
        .bind(id.map(|i| i.to_string()))
        .bind(state)
        .bind(f.name.as_deref())
        .bind(limit)
        .bind(f.key.as_deref())
        .bind(f.waiting)
        .bind(stalled_before)
        .bind(f.created_from_ms)
        .bind(f.created_to_ms)
        .bind(f.after.map(|c| c.created_at_ms))
        .bind(f.after.map(|c| c.id.to_string()))
        .bind(f.parent.map(|p| p.to_string()))
        .fetch_all(reader)
        .await?;
        rows.iter()
            .map(|r| summary(parse_id(&r.try_get::<String, _>("id")?)?, r))
            .collect()
    }, postgres(pool) => {
        let rows = sqlx::query(
            "SELECT * FROM (SELECT i.id, i.name, i.version, i.state, i.error, k.key,
                    i.parent_id::text AS parent_id,
                    floor(extract(epoch FROM i.created_at) * 1000)::bigint AS created_at,
                    floor(extract(epoch FROM i.updated_at) * 1000)::bigint AS updated_at,
                    (SELECT substr(s.destination, 8) FROM saga_steps s WHERE s.saga_id = i.id AND s.state = 'dispatched' AND s.destination LIKE 'signal:%' ORDER BY s.idx LIMIT 1) AS waiting_for
                 FROM saga_instances i LEFT JOIN saga_keys k ON k.saga_id = i.id
                 WHERE ($1::uuid IS NULL OR i.id = $1) AND ($2::text IS NULL OR i.state = $2)
                   AND ($3::text IS NULL OR i.name = $3) AND ($5::text IS NULL OR k.key = $5)
                   AND ($7::bigint IS NULL OR i.state IN ('running', 'compensating'))
                   AND ($8::bigint IS NULL OR i.created_at >= to_timestamp($8 / 1000.0))
                   AND ($9::bigint IS NULL OR i.created_at < to_timestamp($9 / 1000.0))
                   AND ($12::uuid IS NULL OR i.parent_id = $12)) AS v
                 WHERE (NOT $6 OR v.waiting_for IS NOT NULL)
                   AND ($10::bigint IS NULL OR v.created_at < $10 OR (v.created_at = $10 AND v.id < $11::uuid))
                   AND ($7::bigint IS NULL OR (v.waiting_for IS NULL AND (v.updated_at < $7 OR NOT EXISTS (
                        SELECT 1 FROM saga_steps s JOIN outbox o ON o.key = s.saga_id::text || ':' || s.idx::text
                        WHERE s.saga_id = v.id AND (o.state IN ('pending', 'in_flight')
                            OR (o.state = 'delivered' AND ((s.state = 'dispatched' AND o.id = s.command_id)
                                OR (s.compensation_state = 'dispatched' AND o.id = s.compensation_message_id))
                                AND NOT EXISTS (SELECT 1 FROM inbox n WHERE n.consumer = o.destination AND n.message_id = o.id)))))))
                 ORDER BY v.created_at DESC, v.id DESC LIMIT $4",
        )
        .bind(id.map(|i| *i.as_uuid()))
        .bind(state)
        .bind(f.name.as_deref())
        .bind(limit)
        .bind(f.key.as_deref())
        .bind(f.waiting)
        .bind(stalled_before)
        .bind(f.created_from_ms)
        .bind(f.created_to_ms)
        .bind(f.after.map(|c| c.created_at_ms))
        .bind(f.after.map(|c| *c.id.as_uuid()))
        .bind(f.parent.map(|p| *p.as_uuid()))
        .fetch_all(pool)
        .await?;
        rows.iter()
            .map(|r| summary(SagaId::from(r.try_get::<uuid::Uuid, _>("id")?), r))
            .collect()
    })
}

/// A saga's data as it now stands (for a planned saga: its input, its plan and the
/// steps' results); `None` for an unknown saga.
///
/// # Errors
/// Store errors; [`crate::Error::Corrupt`] for data that is not JSON.
pub async fn data(store: &Store, id: SagaId) -> Result<Option<serde_json::Value>> {
    let text: Option<String> = agentsaga_core::match_reader!(store.reader(), sqlite(reader) => {
        sqlx::query_scalar("SELECT data FROM saga_instances WHERE id = ?1")
            .bind(id.to_string())
            .fetch_optional(reader)
            .await?
    }, postgres(pool) => {
        sqlx::query_scalar("SELECT data::text FROM saga_instances WHERE id = $1")
            .bind(id.as_uuid())
            .fetch_optional(pool)
            .await?
    });
    text.map(|t| {
        serde_json::from_str(&t)
            .map_err(|e| crate::Error::Corrupt(format!("saga {id}'s data is not JSON: {e}")))
    })
    .transpose()
}

/// A saga's steps with the compensation ledger, in step order.
///
/// # Errors
/// Store errors.
pub async fn steps(store: &Store, id: SagaId) -> Result<Vec<StepView>> {
    macro_rules! view {
        ($r:expr, $int:ty) => {{
            let r = $r;
            Ok(StepView {
                idx: r.try_get::<$int, _>("idx")? as i64,
                stage: r.try_get::<$int, _>("stage")? as i64,
                name: r.try_get("name")?,
                destination: r.try_get("destination")?,
                state: StepState::from_str(&r.try_get::<String, _>("state")?)
                    .map_err(Error::Corrupt)?,
                attempts: r.try_get::<$int, _>("attempts")? as i64,
                error: r.try_get("error")?,
                compensation_destination: r.try_get("compensation_destination")?,
                compensation_payload: r.try_get("compensation_payload")?,
                compensation_state: r
                    .try_get::<Option<String>, _>("compensation_state")?
                    .map(|s| CompensationState::from_str(&s).map_err(Error::Corrupt))
                    .transpose()?,
                compensation_attempts: r.try_get::<$int, _>("compensation_attempts")? as i64,
                compensation_error: r.try_get("compensation_error")?,
                dispatched_at_ms: r.try_get("dispatched_at")?,
                replied_at_ms: r.try_get("replied_at")?,
                compensated_at_ms: r.try_get("compensated_at")?,
                usage: r
                    .try_get::<Option<String>, _>("usage")?
                    .map(|u| serde_json::from_str(&u))
                    .transpose()?
                    .unwrap_or_default(),
            })
        }};
    }
    agentsaga_core::match_reader!(store.reader(), sqlite(reader) => {
        let rows = sqlx::query(
            "SELECT idx, stage, name, destination, state, attempts, error,
                    compensation_destination, compensation_payload, compensation_state,
                    compensation_attempts, compensation_error, dispatched_at, replied_at,
                    compensated_at, usage
                 FROM saga_steps WHERE saga_id = ?1 ORDER BY idx",
        )
        .bind(id.to_string())
        .fetch_all(reader)
        .await?;
        rows.iter().map(|r| view!(r, i64)).collect()
    }, postgres(pool) => {
        let rows = sqlx::query(
            "SELECT idx, stage, name, destination, state, attempts, error,
                    compensation_destination, compensation_payload::text AS compensation_payload,
                    compensation_state, compensation_attempts, compensation_error,
                    (extract(epoch FROM dispatched_at) * 1000)::bigint AS dispatched_at,
                    (extract(epoch FROM replied_at) * 1000)::bigint AS replied_at,
                    (extract(epoch FROM compensated_at) * 1000)::bigint AS compensated_at,
                    usage::text AS usage
                 FROM saga_steps WHERE saga_id = $1 ORDER BY idx",
        )
        .bind(id.as_uuid())
        .fetch_all(pool)
        .await?;
        rows.iter().map(|r| view!(r, i32)).collect()
    })
}

/// Sagas not yet terminal (running, compensating or stuck), with name and version.
///
/// # Errors
/// Store errors.
pub async fn unfinished(store: &Store) -> Result<Vec<SagaSummary>> {
    let mut out = Vec::new();
    for state in [
        SagaState::Running,
        SagaState::Compensating,
        SagaState::Stuck,
    ] {
        out.extend(
            list(
                store,
                &ListFilter {
                    state: Some(state),
                    limit: u32::MAX,
                    ..ListFilter::default()
                },
            )
            .await?,
        );
    }
    Ok(out)
}
