//! The sagas: a page of them (filtered, with a cursor), one with its data, its steps
//! and what it spent.

use agentsaga_saga::query::{self, Cursor, ListFilter, SagaSummary, Spending, StepView};
use agentsaga_saga::{SagaId, SagaState, Usage};
use serde::Serialize;
use serde_json::Value;

use super::{Console, Error, MAX_PAGE, Result, RewindDoc, json_value};
use crate::time::rfc3339;

/// One saga, as `sagas list --json` and `sagas show --json` print it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SagaDoc {
    /// Its id (a UUID).
    pub id: String,
    /// The saga's name.
    pub name: String,
    /// The definition version it runs.
    pub version: i32,
    /// Its lifecycle state.
    pub state: &'static str,
    /// The last error.
    pub error: Option<String>,
    /// The idempotency key it was started with.
    pub key: Option<String>,
    /// The signal it is parked waiting for.
    pub waiting_for: Option<String>,
    /// When it wakes, if it is parked at a sleep (`Step::sleep`).
    pub sleeping_until: Option<String>,
    /// The same, Unix ms.
    pub sleeping_until_ms: Option<i64>,
    /// The saga whose step started it, for a child saga.
    pub parent_id: Option<String>,
    /// Who paused it, why and when, if an operator paused it (`sagas pause`): it
    /// sends nothing new until it is resumed.
    pub paused: Option<PausedDoc>,
    /// When it started.
    pub created_at: String,
    /// When it started, Unix ms.
    pub created_at_ms: i64,
    /// Its last change.
    pub updated_at: String,
    /// Its last change, Unix ms.
    pub updated_at_ms: i64,
}

impl From<&SagaSummary> for SagaDoc {
    fn from(s: &SagaSummary) -> Self {
        Self {
            id: s.id.to_string(),
            name: s.name.clone(),
            version: s.version,
            state: s.state.as_str(),
            error: s.error.clone(),
            key: s.key.clone(),
            waiting_for: s.waiting_for.clone(),
            sleeping_until: s.sleeping_until_ms.map(rfc3339),
            sleeping_until_ms: s.sleeping_until_ms,
            parent_id: s.parent_id.map(|p| p.to_string()),
            paused: s.paused.as_ref().map(|p| PausedDoc {
                by: p.by.clone(),
                reason: p.reason.clone(),
                at: rfc3339(p.at_ms),
                at_ms: p.at_ms,
            }),
            created_at: rfc3339(s.created_at_ms),
            created_at_ms: s.created_at_ms,
            updated_at: rfc3339(s.updated_at_ms),
            updated_at_ms: s.updated_at_ms,
        }
    }
}

/// Who paused a saga, why and when: a [`SagaDoc`]'s `paused`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PausedDoc {
    /// Who paused it (an operator's name, `console`, `mcp`).
    pub by: String,
    /// Why.
    pub reason: String,
    /// When.
    pub at: String,
    /// When, Unix ms.
    pub at_ms: i64,
}

/// One step of a saga with its compensation-ledger entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepDoc {
    /// Index in the saga.
    pub idx: i64,
    /// Its stage (parallel group).
    pub stage: i64,
    /// The step's name.
    pub name: String,
    /// Where its command went (`signal:<name>` for a wait).
    pub destination: String,
    /// Where the forward step stands.
    pub state: String,
    /// Dispatches so far.
    pub attempts: i64,
    /// Its last error.
    pub error: Option<String>,
    /// When it was (last) dispatched.
    pub dispatched_at: Option<String>,
    /// The same, Unix ms.
    pub dispatched_at_ms: Option<i64>,
    /// When its reply came.
    pub replied_at: Option<String>,
    /// The same, Unix ms.
    pub replied_at_ms: Option<i64>,
    /// Its deadline: for a sleep (`sleep:<name>`), or a wait that ends by time or
    /// times out, when it does; for a command with a start timeout, when that passes.
    pub wakes_at: Option<String>,
    /// The same, Unix ms.
    pub wakes_at_ms: Option<i64>,
    /// Where its compensation goes.
    pub compensation_destination: Option<String>,
    /// Its compensation's payload, once built.
    pub compensation_payload: Option<Value>,
    /// Where its compensation stands.
    pub compensation_state: Option<String>,
    /// Compensation dispatches so far.
    pub compensation_attempts: i64,
    /// The compensation's last error.
    pub compensation_error: Option<String>,
    /// When it was compensated.
    pub compensated_at: Option<String>,
    /// The same, Unix ms.
    pub compensated_at_ms: Option<i64>,
    /// What its agent reported it used (`{}` for nothing).
    pub usage: Usage,
}

impl From<&StepView> for StepDoc {
    fn from(s: &StepView) -> Self {
        Self {
            idx: s.idx,
            stage: s.stage,
            name: s.name.clone(),
            destination: s.destination.clone(),
            state: s.state.to_string(),
            attempts: s.attempts,
            error: s.error.clone(),
            dispatched_at: s.dispatched_at_ms.map(rfc3339),
            dispatched_at_ms: s.dispatched_at_ms,
            replied_at: s.replied_at_ms.map(rfc3339),
            replied_at_ms: s.replied_at_ms,
            wakes_at: s.wakes_at_ms.map(rfc3339),
            wakes_at_ms: s.wakes_at_ms,
            compensation_destination: s.compensation_destination.clone(),
            compensation_payload: s.compensation_payload.as_deref().map(json_value),
            compensation_state: s.compensation_state.map(|c| c.to_string()),
            compensation_attempts: s.compensation_attempts,
            compensation_error: s.compensation_error.clone(),
            compensated_at: s.compensated_at_ms.map(rfc3339),
            compensated_at_ms: s.compensated_at_ms,
            usage: s.usage,
        }
    }
}

/// A page of sagas: `sagas list --json`, `GET /api/v1/sagas`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SagaPage {
    /// The sagas, newest first.
    pub sagas: Vec<SagaDoc>,
    /// Pass it as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// One saga with its data and its steps: `sagas show --json`, `GET /api/v1/sagas/{id}`,
/// and the answer of every action on a saga.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShowDoc {
    /// The saga.
    pub saga: SagaDoc,
    /// Its data as it now stands (a planned saga's: input, plan, results).
    pub data: Value,
    /// What it used (its steps' usage and its child sagas'), its budget, and whether
    /// a spent budget holds it until a person raises it.
    pub spending: Spending,
    /// Its steps in index order, with the compensation ledger.
    pub steps: Vec<StepDoc>,
    /// The child sagas its steps started (`Step::saga`), newest first (at most 100:
    /// `sagas list --parent` pages through them all).
    pub children: Vec<SagaDoc>,
    /// Its rewinds (`sagas rewind`), oldest first: the one under way, if any, last
    /// (empty for a saga never rewound).
    pub rewinds: Vec<RewindDoc>,
}

/// Which sagas a list wants: `sagas list` flags, `GET /api/v1/sagas` parameters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SagaQuery {
    /// Only this state.
    pub state: Option<SagaState>,
    /// Only this saga name.
    pub name: Option<String>,
    /// Only the saga started with this key.
    pub key: Option<String>,
    /// Only sagas parked at a wait.
    pub waiting: bool,
    /// Only sagas parked at a sleep.
    pub sleeping: bool,
    /// Only the child sagas of this saga.
    pub parent: Option<SagaId>,
    /// Only stalled sagas.
    pub stalled: bool,
    /// Only sagas created at or after this Unix ms.
    pub created_from_ms: Option<i64>,
    /// Only sagas created before this Unix ms.
    pub created_to_ms: Option<i64>,
    /// The page after this cursor (a `next_cursor`).
    pub cursor: Option<String>,
    /// At most this many (1 to [`MAX_PAGE`]; 0 means 100).
    pub limit: u32,
}

impl Console {
    /// A page of sagas, newest first.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad cursor or limit; [`Error::Store`].
    pub async fn sagas(&self, q: &SagaQuery) -> Result<SagaPage> {
        if q.limit > MAX_PAGE {
            return Err(Error::Invalid(format!(
                "limit {} is over the maximum of {MAX_PAGE}",
                q.limit
            )));
        }
        let limit = if q.limit == 0 { 100 } else { q.limit };
        let after = q
            .cursor
            .as_deref()
            .map(str::parse::<Cursor>)
            .transpose()
            .map_err(Error::Invalid)?;
        let filter = ListFilter {
            state: q.state,
            name: q.name.clone(),
            key: q.key.clone(),
            waiting: q.waiting,
            sleeping: q.sleeping,
            parent: q.parent,
            stalled: q.stalled.then_some(self.stalled_after),
            created_from_ms: q.created_from_ms,
            created_to_ms: q.created_to_ms,
            after,
            // One more than asked: whether a next page exists.
            limit: limit + 1,
        };
        let mut rows = query::list(&self.store, &filter).await?;
        let more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        Ok(SagaPage {
            next_cursor: more
                .then(|| rows.last().map(|s| Cursor::after(s).to_string()))
                .flatten(),
            sagas: rows.iter().map(SagaDoc::from).collect(),
        })
    }

    /// One saga with its data and steps.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Store`].
    pub async fn saga(&self, id: SagaId) -> Result<ShowDoc> {
        let Some(saga) = query::get(&self.store, id).await? else {
            return Err(Error::NotFound(format!("no saga with id {id}")));
        };
        let steps = query::steps(&self.store, id).await?;
        let data = query::data(&self.store, id).await?.unwrap_or_default();
        let spending = query::spending(&self.store, id).await?.unwrap_or_default();
        let children = query::list(
            &self.store,
            &ListFilter {
                parent: Some(id),
                ..ListFilter::default()
            },
        )
        .await?;
        let rewinds = query::rewinds(&self.store, id).await?;
        Ok(ShowDoc {
            saga: SagaDoc::from(&saga),
            data,
            spending,
            steps: steps.iter().map(StepDoc::from).collect(),
            children: children.iter().map(SagaDoc::from).collect(),
            rewinds: rewinds.iter().map(RewindDoc::from).collect(),
        })
    }
}
