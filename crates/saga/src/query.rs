//! Reading sagas back: for `wait`, for operators and for the CLI.

use std::str::FromStr;

use agentsaga_core::{Row, Sql, Store};
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
    /// When it wakes, Unix ms, if it is parked at a sleep (`Step::sleep`).
    pub sleeping_until_ms: Option<i64>,
    /// The saga whose step started it, for a child saga (`Step::saga`).
    pub parent_id: Option<SagaId>,
    /// Who paused it, why and when, if an operator paused it (`Engine::pause`).
    pub paused: Option<crate::Paused>,
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
    /// Its deadline, Unix ms: for a sleep, or a wait that ends by time or times out,
    /// when it does; for a command with a start timeout, when that passes. Kept once
    /// the step is done.
    pub wakes_at_ms: Option<i64>,
    /// Unix ms.
    pub compensated_at_ms: Option<i64>,
    /// What its attempts and its compensation used, as their agents reported it.
    pub usage: crate::Usage,
}

fn summary(r: &Row) -> Result<SagaSummary> {
    Ok(SagaSummary {
        id: SagaId::from(r.uuid("id")?),
        name: r.text("name")?,
        version: i32::try_from(r.int("version")?)
            .map_err(|_| Error::Corrupt("a saga version out of range".into()))?,
        state: SagaState::from_str(&r.text("state")?).map_err(Error::Corrupt)?,
        error: r.opt_text("error")?,
        key: r.opt_text("key")?,
        waiting_for: r.opt_text("waiting_for")?,
        sleeping_until_ms: r.opt_int("sleeping_until")?,
        parent_id: r.opt_uuid("parent_id")?.map(SagaId::from),
        paused: r
            .opt_text("pause")?
            .map(|p| serde_json::from_str::<crate::engine::PauseRecord>(&p))
            .transpose()?
            .and_then(|p| p.paused),
        created_at_ms: r.int("created_at")?,
        updated_at_ms: r.int("updated_at")?,
    })
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
    /// Only sagas parked at a sleep (`Step::sleep`).
    pub sleeping: bool,
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
/// thing that will move it. A running saga whose steps on their way are all sleeps
/// (or waits) is not stalled, however long it sleeps (its wake-up is on its way). One query, by the `saga_instances` state index, then the
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

/// Saga `id`'s rewinds (`Engine::rewind`), oldest first: the one under way last (its
/// `done_ms` is `None`). Empty for a saga never rewound or not found.
///
/// # Errors
/// Store errors; [`Error::Corrupt`] for a record that does not
/// decode.
pub async fn rewinds(store: &Store, id: SagaId) -> Result<Vec<crate::Rewind>> {
    let row = Sql::new("SELECT rewinds FROM saga_instances WHERE id = ?")
        .bind(*id.as_uuid())
        .fetch_optional(store.reader())
        .await?;
    match row.map(|r| r.opt_text("rewinds")).transpose()?.flatten() {
        None => Ok(Vec::new()),
        Some(text) => serde_json::from_str(&text)
            .map_err(|e| Error::Corrupt(format!("saga {id}: its rewinds: {e}"))),
    }
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
    let stalled_before: Option<i64> = f
        .stalled
        .map(|t| store.clock().now_ms() - i64::try_from(t.as_millis()).unwrap_or(i64::MAX / 2));
    let id = id.map(|i| *i.as_uuid());
    let name = f.name.as_deref();
    let key = f.key.as_deref();
    let cursor = f.after.map(|c| c.created_at_ms);
    let parent = f.parent.map(|p| *p.as_uuid());
    // Times as whole Unix milliseconds (`{ms …}`), so that a cursor's time matches
    // the row it was taken from exactly.
    let rows = Sql::new(
        "SELECT * FROM (SELECT i.id, i.name, i.version, i.state, i.error, k.key, i.pause,
                i.parent_id, {ms i.created_at} AS created_at, {ms i.updated_at} AS updated_at,
                (SELECT substr(s.destination, 8) FROM saga_steps s WHERE s.saga_id = i.id
                   AND s.state = 'dispatched' AND s.destination LIKE 'signal:%'
                 ORDER BY s.idx LIMIT 1) AS waiting_for,
                (SELECT {ms s.deadline} FROM saga_steps s WHERE s.saga_id = i.id
                   AND i.state = 'running' AND s.state = 'dispatched'
                   AND s.destination LIKE 'sleep:%'
                 ORDER BY s.idx LIMIT 1) AS sleeping_until
             FROM saga_instances i LEFT JOIN saga_keys k ON k.saga_id = i.id
             WHERE (? IS NULL OR i.id = ?) AND (? IS NULL OR i.state = ?)
               AND (? IS NULL OR i.name = ?) AND (? IS NULL OR k.key = ?)
               AND (? IS NULL OR i.state IN ('running', 'compensating'))
               AND (? IS NULL OR i.created_at >= ?) AND (? IS NULL OR i.created_at < ?)
               AND (? IS NULL OR i.parent_id = ?)) AS v
         WHERE (NOT ? OR v.waiting_for IS NOT NULL) AND (NOT ? OR v.sleeping_until IS NOT NULL)
           AND (? IS NULL OR v.created_at < ? OR (v.created_at = ? AND v.id < ?))
           AND (? IS NULL OR (v.waiting_for IS NULL AND v.pause IS NULL
                AND (v.sleeping_until IS NULL OR EXISTS (
                SELECT 1 FROM saga_steps s WHERE s.saga_id = v.id AND s.state = 'dispatched'
                  AND s.destination NOT LIKE 'sleep:%' AND s.destination NOT LIKE 'signal:%'))
                AND (v.updated_at < ? OR NOT EXISTS (
                SELECT 1 FROM saga_steps s
                JOIN outbox o ON o.key = CAST(s.saga_id AS TEXT) || ':' || CAST(s.idx AS TEXT)
                WHERE s.saga_id = v.id AND (o.state IN ('pending', 'in_flight')
                    OR (o.state = 'delivered' AND ((s.state = 'dispatched' AND o.id = s.command_id)
                        OR (s.compensation_state = 'dispatched' AND o.id = s.compensation_message_id))
                        AND NOT EXISTS (SELECT 1 FROM inbox n WHERE n.consumer = o.destination AND n.message_id = o.id)))))))
         ORDER BY v.created_at DESC, v.id DESC LIMIT ?",
    )
    .bind(id)
    .bind(id)
    .bind(state)
    .bind(state)
    .bind(name)
    .bind(name)
    .bind(key)
    .bind(key)
    .bind(stalled_before)
    .bind_time(f.created_from_ms)
    .bind_time(f.created_from_ms)
    .bind_time(f.created_to_ms)
    .bind_time(f.created_to_ms)
    .bind(parent)
    .bind(parent)
    .bind(f.waiting)
    .bind(f.sleeping)
    .bind(cursor)
    .bind(cursor)
    .bind(cursor)
    .bind(f.after.map(|c| *c.id.as_uuid()))
    .bind(stalled_before)
    .bind(stalled_before)
    .bind(limit)
    .fetch_all(store.reader())
    .await?;
    rows.iter().map(summary).collect()
}

/// A saga's data as it now stands (for a planned saga: its input, its plan and the
/// steps' results); `None` for an unknown saga.
///
/// # Errors
/// Store errors; [`crate::Error::Corrupt`] for data that is not JSON.
pub async fn data(store: &Store, id: SagaId) -> Result<Option<serde_json::Value>> {
    let text = Sql::new("SELECT data FROM saga_instances WHERE id = ?")
        .bind(*id.as_uuid())
        .fetch_optional(store.reader())
        .await?
        .map(|r| r.text("data"))
        .transpose()?;
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
    let rows = Sql::new(
        "SELECT idx, stage, name, destination, state, attempts, error,
                compensation_destination, compensation_payload, compensation_state,
                compensation_attempts, compensation_error, dispatched_at, replied_at,
                compensated_at, usage, deadline
             FROM saga_steps WHERE saga_id = ? ORDER BY idx",
    )
    .bind(*id.as_uuid())
    .fetch_all(store.reader())
    .await?;
    rows.iter()
        .map(|r| {
            Ok(StepView {
                idx: r.int("idx")?,
                stage: r.int("stage")?,
                name: r.text("name")?,
                destination: r.text("destination")?,
                state: StepState::from_str(&r.text("state")?).map_err(Error::Corrupt)?,
                attempts: r.int("attempts")?,
                error: r.opt_text("error")?,
                compensation_destination: r.opt_text("compensation_destination")?,
                compensation_payload: r.opt_text("compensation_payload")?,
                compensation_state: r
                    .opt_text("compensation_state")?
                    .map(|s| CompensationState::from_str(&s).map_err(Error::Corrupt))
                    .transpose()?,
                compensation_attempts: r.int("compensation_attempts")?,
                compensation_error: r.opt_text("compensation_error")?,
                dispatched_at_ms: r.opt_int("dispatched_at")?,
                replied_at_ms: r.opt_int("replied_at")?,
                wakes_at_ms: r.opt_int("deadline")?,
                compensated_at_ms: r.opt_int("compensated_at")?,
                usage: r
                    .opt_text("usage")?
                    .map(|u| serde_json::from_str(&u))
                    .transpose()?
                    .unwrap_or_default(),
            })
        })
        .collect()
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
