//! The operator's calls and the documents they answer with: the one implementation
//! behind `agentsaga … --json`, the admin HTTP API (`/api/v1`), the web page and the
//! MCP tools. Each call reads or acts in one transaction; an action answers with the
//! saga (or message) as it now stands.

use std::collections::BTreeMap;
use std::time::Duration;

use agentsaga_core::admin::{DeadQuery, DeadRow};
use agentsaga_core::{MessageId, Store};
use agentsaga_saga::query::{self, Cursor, ListFilter, SagaSummary, StepView};
use agentsaga_saga::{
    Engine, SagaDefinition, SagaId, SagaState, Signal, SignalReceipt, SignalSender,
};
use serde::Serialize;
use serde_json::Value;

use crate::time::rfc3339;

/// Every saga state, in lifecycle order: the keys of `sagas` in [`StatusDoc`].
pub const SAGA_STATES: [SagaState; 6] = [
    SagaState::Running,
    SagaState::Compensating,
    SagaState::Stuck,
    SagaState::Completed,
    SagaState::Compensated,
    SagaState::Aborted,
];

/// How long a running saga may make no progress before it counts as stalled, unless
/// configured otherwise ([`Console::stalled_after`]).
pub const DEFAULT_STALLED_AFTER: Duration = Duration::from_secs(15 * 60);

/// The most sagas or dead letters one page or list holds.
pub const MAX_PAGE: u32 = 1000;

/// The most bytes of payloads, headers and errors one page of dead letters holds (but
/// for its first dead letter, bounded by the largest message the store takes): 4 MiB.
/// A page cut short says where the next one starts (`next_before`).
pub const MAX_PAGE_BYTES: usize = 4 << 20;

/// The dead letters [`Console::redrive_all`] reads at a time.
const REDRIVE_BATCH: u32 = 100;

/// What an operator's call can answer instead of a document.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No saga, dead letter or saga name with that id.
    #[error("{0}")]
    NotFound(String),
    /// The saga's (or message's) state does not allow it; nothing was changed.
    #[error("{0}")]
    Refused(String),
    /// The request itself is wrong (a filter, a key, a plan, data): nothing was done.
    #[error("{0}")]
    Invalid(String),
    /// The database failed.
    #[error("{0}")]
    Store(String),
}

impl Error {
    /// The error's kind as the admin API and the MCP tools name it: `not_found`,
    /// `refused`, `invalid` or `internal`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::NotFound(_) => "not_found",
            Error::Refused(_) => "refused",
            Error::Invalid(_) => "invalid",
            Error::Store(_) => "internal",
        }
    }
}

/// `Result` with the console's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<agentsaga_core::Error> for Error {
    fn from(e: agentsaga_core::Error) -> Self {
        Error::Store(e.to_string())
    }
}

impl From<agentsaga_saga::Error> for Error {
    fn from(e: agentsaga_saga::Error) -> Self {
        use agentsaga_saga::Error as S;
        match e {
            S::NotFound(_) | S::UnknownSaga(_) => Error::NotFound(e.to_string()),
            S::WrongState { .. } | S::SignalRefused { .. } | S::Busy { .. } => {
                Error::Refused(e.to_string())
            }
            S::InvalidKey { .. } | S::InvalidPlan(_) | S::Data(_) | S::Malformed(_) => {
                Error::Invalid(e.to_string())
            }
            S::VersionNotRegistered { .. } | S::StartSetAside { .. } => {
                Error::Refused(e.to_string())
            }
            other => Error::Store(other.to_string()),
        }
    }
}

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
            created_at: rfc3339(s.created_at_ms),
            created_at_ms: s.created_at_ms,
            updated_at: rfc3339(s.updated_at_ms),
            updated_at_ms: s.updated_at_ms,
        }
    }
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
            compensation_destination: s.compensation_destination.clone(),
            compensation_payload: s.compensation_payload.as_deref().map(json_value),
            compensation_state: s.compensation_state.map(|c| c.to_string()),
            compensation_attempts: s.compensation_attempts,
            compensation_error: s.compensation_error.clone(),
            compensated_at: s.compensated_at_ms.map(rfc3339),
            compensated_at_ms: s.compensated_at_ms,
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
    /// Its steps in index order, with the compensation ledger.
    pub steps: Vec<StepDoc>,
}

impl ShowDoc {
    /// The actions the engine would take on this saga as it stands (the page offers
    /// only these): abort a running saga before its pivot; retry or skip a stuck one
    /// whose compensation failed; retry or abort one stuck after its pivot.
    pub fn actions(&self) -> Vec<Action> {
        // The pivot and the steps after it are the rows without a compensation entry.
        let past_pivot = self.steps.iter().any(|s| s.compensation_state.is_none());
        let compensation_failed = self
            .steps
            .iter()
            .any(|s| s.compensation_state.as_deref() == Some("failed"));
        match self.saga.state {
            "running" if !past_pivot => vec![Action::Abort],
            "stuck" if compensation_failed => vec![Action::Retry, Action::Skip],
            "stuck" => vec![Action::Retry, Action::Abort],
            _ => Vec::new(),
        }
    }
}

/// Outbox counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxDoc {
    /// Rows waiting for delivery (timers included).
    pub pending: u64,
    /// Rows claimed by a relay.
    pub in_flight: u64,
    /// Rows delivered and not yet pruned.
    pub delivered: u64,
    /// Dead letters.
    pub dead: u64,
    /// How long the oldest ready pending row has waited (the relay's lag).
    pub oldest_pending_age_ms: Option<u64>,
}

/// `agentsaga status --json`, `GET /api/v1/status`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusDoc {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// The outbox.
    pub outbox: OutboxDoc,
    /// Dead letters (as `outbox.dead`).
    pub dead_letters: u64,
    /// Sagas per state, every state present.
    pub sagas: BTreeMap<&'static str, u64>,
    /// All sagas.
    pub sagas_total: u64,
    /// Starts waiting for room under their admission bound, per saga name.
    pub starts_waiting: BTreeMap<String, u64>,
    /// Starts that could not be started when their turn came, set aside (they hold
    /// nothing up; see `agentsaga starts list`), per saga name.
    pub starts_set_aside: BTreeMap<String, u64>,
    /// Stalled sagas (at most [`MAX_PAGE`] counted).
    pub stalled: u64,
    /// The no-progress threshold `stalled` used, in ms.
    pub stalled_after_ms: u64,
}

/// A start set aside: `starts list --json` (each), `starts remove --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetAsideDoc {
    /// The id it was given (no saga has it).
    pub id: String,
    /// The saga name.
    pub name: String,
    /// Its data.
    pub data: Value,
    /// Why it could not start.
    pub error: String,
    /// When it was accepted (RFC 3339).
    pub created_at: String,
    /// The same, Unix ms.
    pub created_at_ms: i64,
    /// When it was set aside (RFC 3339).
    pub set_aside_at: String,
    /// The same, Unix ms.
    pub set_aside_at_ms: i64,
}

impl From<&agentsaga_saga::SetAsideStart> for SetAsideDoc {
    fn from(s: &agentsaga_saga::SetAsideStart) -> Self {
        Self {
            id: s.id.to_string(),
            name: s.name.clone(),
            data: s.data.clone(),
            error: s.error.clone(),
            created_at: crate::time::rfc3339(s.created_at_ms),
            created_at_ms: s.created_at_ms,
            set_aside_at: crate::time::rfc3339(s.set_aside_at_ms),
            set_aside_at_ms: s.set_aside_at_ms,
        }
    }
}

/// One dead letter: `dead list --json` (each), `dead show --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadDoc {
    /// The message id.
    pub id: String,
    /// Its outbox sequence number.
    pub seq: i64,
    /// Where it was going.
    pub destination: String,
    /// Its ordering key.
    pub key: Option<String>,
    /// Delivery attempts.
    pub attempts: u32,
    /// When it was written.
    pub created_at: String,
    /// The same, Unix ms.
    pub created_at_ms: i64,
    /// Why it died.
    pub last_error: Option<String>,
    /// Its headers.
    pub headers: BTreeMap<String, String>,
    /// Its payload (JSON, or the text it is).
    pub payload: Value,
    /// Why re-driving it would be wrong (its saga has moved past it), if it would.
    pub moot: Option<String>,
}

impl From<&DeadRow> for DeadDoc {
    fn from(d: &DeadRow) -> Self {
        let e = &d.envelope;
        Self {
            moot: None,
            id: e.id.to_string(),
            seq: e.seq,
            destination: e.destination.clone(),
            key: e.key.clone(),
            attempts: e.attempts,
            created_at: rfc3339(e.created_at_ms),
            created_at_ms: e.created_at_ms,
            last_error: d.last_error.clone(),
            headers: e.headers.clone(),
            payload: json_value(&e.payload),
        }
    }
}

/// `dead list --json`, `GET /api/v1/dead`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadList {
    /// The dead letters, newest first.
    pub dead_letters: Vec<DeadDoc>,
    /// When more follow (the page is full, in rows or in bytes): the `seq` to ask for
    /// dead letters before (`before`), for the next page; `null` for the last page.
    pub next_before: Option<i64>,
}

/// What became of one dead letter asked to be re-driven.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedriveDoc {
    /// The message id.
    pub id: String,
    /// `redriven` (pending again, attempts reset) or `purged` (moot, with `force`).
    pub outcome: &'static str,
    /// Why it was moot, when purged.
    pub moot: Option<String>,
}

/// What a re-drive of many dead letters did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedriveAllDoc {
    /// Re-driven: pending again, attempts reset.
    pub redriven: u64,
    /// Purged as moot (with `force`).
    pub purged: u64,
    /// Left as they are, moot: each id with why.
    pub refused: Vec<Refusal>,
}

/// A dead letter a re-drive left alone.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Refusal {
    /// The message id.
    pub id: String,
    /// Why re-driving it would be wrong.
    pub reason: String,
}

/// What a purge did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PurgeDoc {
    /// Dead letters deleted.
    pub purged: u64,
}

/// What a signal did, and the saga after it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SignalDoc {
    /// `recorded`, or `duplicate` (the wait had its signal already: nothing changed).
    pub receipt: &'static str,
    /// The saga as it now stands.
    #[serde(flatten)]
    pub saga: ShowDoc,
}

/// An operator action on a saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Compensate a running saga, or give up on one stuck after its pivot.
    Abort,
    /// Try a stuck saga's failed compensation (or step after the pivot) again.
    Retry,
    /// Mark a stuck compensation done by hand, and go on.
    Skip,
}

impl Action {
    /// Its name in the CLI and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Abort => "abort",
            Action::Retry => "retry",
            Action::Skip => "skip",
        }
    }
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

/// The operator's calls on one store.
#[derive(Clone, Debug)]
pub struct Console {
    store: Store,
    engine: Engine,
    stalled_after: Duration,
}

impl Console {
    /// The calls on `store`, with no saga definitions: everything but retrying a step
    /// after the pivot and starting sagas works from the database alone.
    pub fn new(store: Store) -> Self {
        Self {
            store,
            engine: Engine::new(Vec::<SagaDefinition>::new()).expect("no definitions"),
            stalled_after: DEFAULT_STALLED_AFTER,
        }
    }

    /// The calls with `engine`'s definitions (a runtime's): its sagas can also be
    /// started, and retried past their pivot.
    #[must_use]
    pub fn with_engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }

    /// How long a running saga may make no progress before it counts as stalled
    /// (default 15 minutes).
    #[must_use]
    pub fn stalled_after(mut self, threshold: Duration) -> Self {
        self.stalled_after = threshold;
        self
    }

    /// The no-progress threshold of stalled sagas.
    pub fn stalled_threshold(&self) -> Duration {
        self.stalled_after
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The saga names this console can start (those of its engine).
    pub fn startable(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .engine
            .definitions()
            .map(|d| d.name().to_owned())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Outbox counts, relay lag, sagas per state, waiting starts, stalled sagas.
    ///
    /// Cheap however many finished sagas the database keeps: the sagas under way
    /// (running, compensating, stuck) and the stalled ones are counted through the
    /// state index, the finished ones (completed, compensated, aborted) are read from
    /// the counts the database keeps itself (`saga_finished_counts`); all exact at
    /// the time of the call.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn status(&self) -> Result<StatusDoc> {
        const LIVE: [SagaState; 3] = [
            SagaState::Running,
            SagaState::Compensating,
            SagaState::Stuck,
        ];
        let stats = self.store.admin().stats().await?;
        let mut counts = query::count_in_states(&self.store, &LIVE).await?;
        let finished = query::count_finished(&self.store).await?;
        counts.extend(finished);
        let starts_waiting: BTreeMap<String, u64> = Engine::waiting_starts(&self.store)
            .await?
            .into_iter()
            .collect();
        let mut starts_set_aside: BTreeMap<String, u64> = BTreeMap::new();
        for s in Engine::set_aside_starts(&self.store).await? {
            *starts_set_aside.entry(s.name).or_default() += 1;
        }
        let stalled = query::count_stalled(&self.store, self.stalled_after).await?;
        let mut sagas: BTreeMap<&'static str, u64> =
            SAGA_STATES.iter().map(|s| (s.as_str(), 0)).collect();
        for (state, n) in &counts {
            *sagas.entry(state.as_str()).or_default() += n;
        }
        Ok(StatusDoc {
            backend: self.store.backend(),
            dead_letters: stats.dead,
            sagas_total: sagas.values().sum(),
            sagas,
            starts_waiting,
            starts_set_aside,
            stalled,
            stalled_after_ms: u64::try_from(self.stalled_after.as_millis()).unwrap_or(u64::MAX),
            outbox: OutboxDoc {
                pending: stats.pending,
                in_flight: stats.in_flight,
                delivered: stats.delivered,
                dead: stats.dead,
                oldest_pending_age_ms: stats.oldest_pending_age_ms,
            },
        })
    }

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
        Ok(ShowDoc {
            saga: SagaDoc::from(&saga),
            data,
            steps: steps.iter().map(StepDoc::from).collect(),
        })
    }

    /// Abort, retry or skip saga `id`, in one transaction committed only if the engine
    /// accepts it; answers with the saga as it now stands.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Refused`] saying why (nothing changed);
    /// [`Error::Store`].
    pub async fn act(&self, id: SagaId, action: Action) -> Result<ShowDoc> {
        let mut tx = self.store.begin().await?;
        let result = match action {
            Action::Abort => self.engine.abort(&mut tx, id).await,
            Action::Retry => self.engine.retry(&mut tx, id).await,
            Action::Skip => self.engine.skip(&mut tx, id).await,
        };
        match result {
            Ok(_) => tx.commit().await?,
            Err(e) => {
                // Nothing of the refused action may stay; a failed rollback only means
                // the transaction is already gone.
                let _ = tx.rollback().await;
                return Err(e.into());
            }
        }
        self.saga(id).await
    }

    /// Sends saga `id` the signal `name`; answers with the receipt and the saga.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown saga; [`Error::Refused`] for a finished saga
    /// or a name it never waits for (nothing written); [`Error::Store`].
    pub async fn signal(&self, id: SagaId, name: &str, signal: Signal) -> Result<SignalDoc> {
        self.signal_by(id, name, signal, SignalSender::Person).await
    }

    /// [`signal`](Self::signal) from `sender`: the MCP tools send as
    /// [`SignalSender::Agent`], which may not release a wait that is a person's
    /// decision (`Step::approval`).
    ///
    /// # Errors
    /// As [`signal`](Self::signal); [`Error::Refused`] for an agent's signal to a
    /// person's decision (nothing written).
    pub async fn signal_by(
        &self,
        id: SagaId,
        name: &str,
        signal: Signal,
        sender: SignalSender,
    ) -> Result<SignalDoc> {
        let mut tx = self.store.begin().await?;
        let receipt = match Engine::signal_by(&mut tx, id, name, signal, sender).await {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e.into());
            }
        };
        tx.commit().await?;
        Ok(SignalDoc {
            receipt: match receipt {
                SignalReceipt::Recorded => "recorded",
                SignalReceipt::Duplicate => "duplicate",
            },
            saga: self.saga(id).await?,
        })
    }

    /// Starts saga `name` (one this console's engine has) with `data`, under `key` if
    /// given; answers with the saga.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a saga this process does not host; [`Error::Invalid`]
    /// for bad data, key or plan; [`Error::Store`].
    pub async fn start(&self, name: &str, key: Option<&str>, data: Value) -> Result<ShowDoc> {
        if !self.engine.definitions().any(|d| d.name() == name) {
            let hosted = self.startable();
            return Err(Error::NotFound(if hosted.is_empty() {
                format!("this process hosts no saga named `{name}` (it hosts none)")
            } else {
                format!(
                    "this process hosts no saga named `{name}` (it hosts: {})",
                    hosted.join(", ")
                )
            }));
        }
        let mut tx = self.store.begin().await?;
        let accepted = match self.engine.accept_keyed(&mut tx, name, key, data).await {
            Ok(a) => a,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e.into());
            }
        };
        tx.commit().await?;
        let id = accepted.id();
        match self.saga(id).await {
            // Waiting for room under the admission bound: not in `saga_instances` yet.
            Err(Error::NotFound(_)) if Engine::is_waiting(&self.store, id).await? => {
                Err(Error::Refused(format!(
                    "saga {id} is accepted and waits for room under its admission bound"
                )))
            }
            other => other,
        }
    }

    /// Dead letters, newest first (to `destination` only, if given), each saying
    /// whether re-driving it would be moot: at most `limit` and [`MAX_PAGE_BYTES`].
    ///
    /// # Errors
    /// [`Error::Invalid`] for a limit over [`MAX_PAGE`]; [`Error::Store`].
    pub async fn dead_letters(&self, destination: Option<&str>, limit: u32) -> Result<DeadList> {
        self.dead_letters_before(destination, None, limit).await
    }

    /// [`dead_letters`](Self::dead_letters) older than outbox seq `before` (a page's
    /// `next_before`).
    ///
    /// # Errors
    /// As [`dead_letters`](Self::dead_letters).
    pub async fn dead_letters_before(
        &self,
        destination: Option<&str>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<DeadList> {
        if limit > MAX_PAGE {
            return Err(Error::Invalid(format!(
                "limit {limit} is over the maximum of {MAX_PAGE}"
            )));
        }
        let limit = if limit == 0 { 100 } else { limit };
        let q = DeadQuery {
            destination,
            before_seq: before,
            limit,
            max_bytes: MAX_PAGE_BYTES,
        };
        let (rows, more) = self.store.admin().dead_letters_page(&q).await?;
        let mut dead_letters = Vec::with_capacity(rows.len());
        for d in &rows {
            dead_letters.push(self.dead_doc(d).await?);
        }
        Ok(DeadList {
            next_before: more.then(|| rows.last().map(|d| d.envelope.seq)).flatten(),
            dead_letters,
        })
    }

    /// One dead letter.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Store`].
    pub async fn dead_letter(&self, id: MessageId) -> Result<DeadDoc> {
        let row = self.dead_row(id).await?;
        self.dead_doc(&row).await
    }

    async fn dead_row(&self, id: MessageId) -> Result<DeadRow> {
        self.store
            .admin()
            .dead_letter(id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("dead letter `{id}` not found")))
    }

    async fn dead_doc(&self, d: &DeadRow) -> Result<DeadDoc> {
        let mut doc = DeadDoc::from(d);
        doc.moot = Engine::moot(&self.store, &d.envelope).await?;
        Ok(doc)
    }

    /// Re-drives dead letter `id` (pending again, attempts reset), unless its saga has
    /// moved past it: then it is refused, or with `force` purged instead.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Refused`] for a moot one without `force`;
    /// [`Error::Store`].
    pub async fn redrive(&self, id: MessageId, force: bool) -> Result<RedriveDoc> {
        let row = self.dead_row(id).await?;
        match Engine::moot(&self.store, &row.envelope).await? {
            Some(why) if force => {
                self.store.admin().purge_dead_letter(id).await?;
                Ok(RedriveDoc {
                    id: id.to_string(),
                    outcome: "purged",
                    moot: Some(why),
                })
            }
            Some(why) => Err(Error::Refused(format!(
                "refused to re-drive dead letter {id}: {why}. Re-driving it could undo what \
                 its saga decided; a forced re-drive purges it instead"
            ))),
            None => {
                self.store.admin().redrive(id).await?;
                Ok(RedriveDoc {
                    id: id.to_string(),
                    outcome: "redriven",
                    moot: None,
                })
            }
        }
    }

    /// Re-drives every dead letter (to `destination`, if given) that is not moot;
    /// moot ones are left (or with `force` purged).
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn redrive_all(
        &self,
        destination: Option<&str>,
        force: bool,
    ) -> Result<RedriveAllDoc> {
        let mut doc = RedriveAllDoc {
            redriven: 0,
            purged: 0,
            refused: Vec::new(),
        };
        // A batch at a time, newest first, each batch bounded in rows and bytes: the
        // dead letters are never all in memory.
        let mut before = None;
        loop {
            let q = DeadQuery {
                destination,
                before_seq: before,
                limit: REDRIVE_BATCH,
                max_bytes: MAX_PAGE_BYTES,
            };
            let (rows, more) = self.store.admin().dead_letters_page(&q).await?;
            self.redrive_batch(&rows, force, &mut doc).await?;
            match rows.last() {
                Some(last) if more => before = Some(last.envelope.seq),
                _ => return Ok(doc),
            }
        }
    }

    async fn redrive_batch(
        &self,
        rows: &[DeadRow],
        force: bool,
        doc: &mut RedriveAllDoc,
    ) -> Result<()> {
        for row in rows {
            let id = row.envelope.id;
            match Engine::moot(&self.store, &row.envelope).await? {
                Some(_) if force => {
                    self.store.admin().purge_dead_letter(id).await?;
                    doc.purged += 1;
                }
                Some(why) => doc.refused.push(Refusal {
                    id: id.to_string(),
                    reason: why,
                }),
                None => {
                    self.store.admin().redrive(id).await?;
                    doc.redriven += 1;
                }
            }
        }
        Ok(())
    }

    /// Deletes dead letter `id`.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Store`].
    pub async fn purge(&self, id: MessageId) -> Result<PurgeDoc> {
        self.dead_row(id).await?;
        self.store.admin().purge_dead_letter(id).await?;
        Ok(PurgeDoc { purged: 1 })
    }

    /// Deletes dead letters created more than `older_than` ago.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn purge_older(&self, older_than: Duration) -> Result<PurgeDoc> {
        Ok(PurgeDoc {
            purged: self.store.admin().purge_dead(older_than).await?,
        })
    }

    /// The starts set aside (they could not be started when their turn came), oldest
    /// first.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn set_aside_starts(&self) -> Result<Vec<SetAsideDoc>> {
        Ok(Engine::set_aside_starts(&self.store)
            .await?
            .iter()
            .map(SetAsideDoc::from)
            .collect())
    }

    /// Deletes the set-aside start `id` (and the idempotency key that named it).
    ///
    /// # Errors
    /// [`Error::NotFound`] if no start `id` is set aside; [`Error::Store`].
    pub async fn remove_start(&self, id: SagaId) -> Result<SetAsideDoc> {
        let Some(start) = Engine::set_aside_start(&self.store, id).await? else {
            return Err(Error::NotFound(format!("no set-aside start `{id}`")));
        };
        let mut tx = self.store.begin().await?;
        if let Err(e) = Engine::remove_set_aside(&mut tx, id).await {
            let _ = tx.rollback().await;
            return Err(match e {
                agentsaga_saga::Error::NotFound(_) => {
                    Error::NotFound(format!("no set-aside start `{id}`"))
                }
                e => e.into(),
            });
        }
        tx.commit().await?;
        Ok(SetAsideDoc::from(&start))
    }
}

/// A saga id as an operator typed it.
///
/// # Errors
/// [`Error::Invalid`] naming the text, for anything but a UUID.
pub fn parse_saga_id(text: &str) -> Result<SagaId> {
    text.parse()
        .map_err(|e| Error::Invalid(format!("malformed saga id `{text}`: not a UUID ({e})")))
}

/// A message id as an operator typed it.
///
/// # Errors
/// [`Error::Invalid`] naming the text, for anything but a UUID.
pub fn parse_message_id(text: &str) -> Result<MessageId> {
    text.parse()
        .map_err(|e| Error::Invalid(format!("malformed message id `{text}`: not a UUID ({e})")))
}

/// A JSON text stored in the database as a JSON value (or, if it does not parse, as
/// the string it is).
pub fn json_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(state: &'static str, ledger: &[Option<&str>]) -> ShowDoc {
        let step = |i: usize, c: Option<&str>| StepDoc {
            idx: i as i64,
            stage: i as i64,
            name: format!("s{i}"),
            destination: "a".into(),
            state: "succeeded".into(),
            attempts: 1,
            error: None,
            dispatched_at: None,
            dispatched_at_ms: None,
            replied_at: None,
            replied_at_ms: None,
            compensation_destination: None,
            compensation_payload: None,
            compensation_state: c.map(str::to_owned),
            compensation_attempts: 0,
            compensation_error: None,
            compensated_at: None,
            compensated_at_ms: None,
        };
        ShowDoc {
            saga: SagaDoc {
                id: "x".into(),
                name: "n".into(),
                version: 1,
                state,
                error: None,
                key: None,
                waiting_for: None,
                created_at: String::new(),
                created_at_ms: 0,
                updated_at: String::new(),
                updated_at_ms: 0,
            },
            data: Value::Null,
            steps: ledger
                .iter()
                .enumerate()
                .map(|(i, c)| step(i, *c))
                .collect(),
        }
    }

    // The actions offered are the ones the engine takes in that state.
    #[test]
    fn actions_follow_the_engine() {
        use Action::{Abort, Retry, Skip};
        assert_eq!(doc("running", &[Some("recorded")]).actions(), [Abort]);
        assert!(
            doc("running", &[Some("recorded"), None])
                .actions()
                .is_empty(),
            "past the pivot"
        );
        assert!(
            doc("compensating", &[Some("dispatched")])
                .actions()
                .is_empty()
        );
        assert_eq!(doc("stuck", &[Some("failed")]).actions(), [Retry, Skip]);
        assert_eq!(
            doc("stuck", &[Some("recorded"), None]).actions(),
            [Retry, Abort]
        );
        for done in ["completed", "compensated", "aborted"] {
            assert!(doc(done, &[Some("done")]).actions().is_empty());
        }
    }
}
