//! The saga engine: starts sagas and advances them, one transaction per event, on the
//! store's tables. It decides; the runtime's actors drive it.

mod admission;
mod logic;
mod model;
mod persist;
mod signals;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use agentsaga_core::{
    Envelope, Headers, Message, Prefetch, Prefetched, Receipt, RetryPolicy, Store, Tx,
};
use serde::Serialize;
use serde_json::Value;
use tracing::Instrument;

use self::logic::{Ctx, Effects};
use self::model::Instance;
pub use self::signals::{Signal, SignalReceipt, SignalSender};
pub(crate) use crate::definition::DeclaredWait;
use crate::protocol::{self, Inbound, Outbound};
use crate::{Error, Result, SagaDefinition, SagaId, SagaState};

/// What [`Engine::handle`] did with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// Seen before (the inbox knew it): nothing done.
    Duplicate,
    /// Consumed without effect, and why (a late reply, an unknown saga...).
    Ignored(String),
    /// The saga moved on; its state now.
    Advanced {
        /// The saga.
        saga: SagaId,
        /// Its state after this message.
        state: SagaState,
    },
}

/// What became of a start: started now, or accepted to start when there is room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// Started: its first commands are written.
    Started(SagaId),
    /// Its saga name had as many sagas in flight as its bound: the start is stored
    /// (in `saga_starts`) and will be started, in order, as sagas finish. The id is the
    /// saga's own.
    Waiting(SagaId),
    /// A saga of this name was already started with this key: nothing was written, and
    /// the id is that saga's (running, finished, or waiting for room).
    Existing(SagaId),
}

impl Accepted {
    /// The saga's id, whichever it is.
    pub fn id(self) -> SagaId {
        match self {
            Accepted::Started(id) | Accepted::Waiting(id) | Accepted::Existing(id) => id,
        }
    }
}

/// A waiting start that could not be started when its turn came, set aside in
/// `saga_starts` with the reason (see [`Engine::admit`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetAsideStart {
    /// The id it was given when accepted (no saga has it).
    pub id: SagaId,
    /// The saga name.
    pub name: String,
    /// Its stored data.
    pub data: Value,
    /// Why it could not start.
    pub error: String,
    /// When it was accepted, Unix ms.
    pub created_at_ms: i64,
    /// When it was set aside, Unix ms.
    pub set_aside_at_ms: i64,
}

impl From<admission::SetAsideRow> for SetAsideStart {
    fn from(r: admission::SetAsideRow) -> Self {
        Self {
            id: r.id,
            name: r.name,
            data: r.data,
            error: r.error,
            created_at_ms: r.created_ms,
            set_aside_at_ms: r.set_aside_ms,
        }
    }
}

/// The longest idempotency key a start accepts, in bytes.
pub const MAX_KEY_BYTES: usize = 256;

/// Sagas in flight per saga name unless configured otherwise (admission control).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1000;

/// Holds the registered saga definitions and advances their instances.
#[derive(Clone, Debug)]
pub struct Engine {
    defs: Arc<HashMap<(String, i32), Arc<SagaDefinition>>>,
    latest: Arc<HashMap<String, i32>>,
    compensation_retry: RetryPolicy,
    max_in_flight: Option<usize>,
    max_in_flight_for: Arc<HashMap<String, Option<usize>>>,
    /// Per saga name: when its in-flight count was last read, and that count plus
    /// the starts admitted here since (never less than the truth in this process).
    in_flight_seen: Arc<std::sync::Mutex<HashMap<String, (std::time::Instant, u64)>>>,
}

/// How long a start may trust the in-flight count an earlier start read.
const IN_FLIGHT_FRESH: std::time::Duration = std::time::Duration::from_millis(100);

impl Engine {
    /// An engine running `definitions`. Several versions of one saga may be registered:
    /// new instances use the highest, running ones finish on their own.
    ///
    /// # Errors
    /// [`Error::InvalidDefinition`] if a name and version appear twice.
    pub fn new(definitions: impl IntoIterator<Item = SagaDefinition>) -> Result<Self> {
        let mut defs = HashMap::new();
        let mut latest: HashMap<String, i32> = HashMap::new();
        for d in definitions {
            let key = (d.name.clone(), d.version);
            let v = latest.entry(d.name.clone()).or_insert(d.version);
            *v = (*v).max(d.version);
            if defs.insert(key, Arc::new(d)).is_some() {
                return Err(Error::InvalidDefinition(
                    "a saga name and version registered twice".into(),
                ));
            }
        }
        Ok(Self {
            defs: Arc::new(defs),
            latest: Arc::new(latest),
            compensation_retry: RetryPolicy::default(),
            max_in_flight: None,
            max_in_flight_for: Arc::default(),
            in_flight_seen: Arc::default(),
        })
    }

    /// Admission control: at most `bound` sagas of each name in flight (running or
    /// compensating); starts beyond it wait in `saga_starts` and start in order as
    /// sagas finish. `None` (the engine's default; the runtime's is
    /// [`DEFAULT_MAX_IN_FLIGHT`]) admits everything at once.
    ///
    /// The bound is approximate: a start trusts an in-flight count up to 100 ms old
    /// (plus the starts this engine made since), so sagas that finished in those
    /// 100 ms are not yet room, and several processes starting the same saga at once
    /// may together pass the bound by the starts of those 100 ms.
    #[must_use]
    pub fn with_max_in_flight(mut self, bound: Option<usize>) -> Self {
        self.max_in_flight = bound.map(|b| b.max(1));
        self
    }

    /// [`with_max_in_flight`](Self::with_max_in_flight) for saga `name` alone.
    #[must_use]
    pub fn with_max_in_flight_for(mut self, name: impl Into<String>, bound: Option<usize>) -> Self {
        Arc::make_mut(&mut self.max_in_flight_for).insert(name.into(), bound.map(|b| b.max(1)));
        self
    }

    /// The admission bound of saga `name`, if it has one.
    pub fn max_in_flight(&self, name: &str) -> Option<usize> {
        self.max_in_flight_for
            .get(name)
            .copied()
            .unwrap_or(self.max_in_flight)
    }

    /// The registered saga names that have an admission bound.
    pub fn bounded_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .latest
            .keys()
            .filter(|n| self.max_in_flight(n).is_some())
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// How failed compensations are retried before the saga is declared stuck
    /// (default: 1 s doubling to 60 s, 10 attempts).
    #[must_use]
    pub fn with_compensation_retry(mut self, policy: RetryPolicy) -> Self {
        self.compensation_retry = policy;
        self
    }

    /// The registered definitions.
    pub fn definitions(&self) -> impl Iterator<Item = &SagaDefinition> {
        self.defs.values().map(AsRef::as_ref)
    }

    /// The destinations the orchestrator consumes: one per registered version.
    pub fn orchestrator_destinations(&self) -> Vec<String> {
        let mut v: Vec<_> = self
            .definitions()
            .map(SagaDefinition::orchestrator_destination)
            .collect();
        v.sort();
        v
    }

    /// Is this saga name and version registered?
    pub fn has(&self, name: &str, version: i32) -> bool {
        self.defs.contains_key(&(name.to_owned(), version))
    }

    /// The definition instance `inst` runs (`None`: its version is not registered
    /// here); for a planned saga, made from the plan in its data.
    fn definition_of(&self, inst: &Instance) -> Result<Option<Arc<SagaDefinition>>> {
        self.defs
            .get(&(inst.name.clone(), inst.version))
            .map(|d| d.for_data(&inst.data))
            .transpose()
    }

    fn ctx<'a>(&'a self, inst: &'a mut Instance) -> Result<Ctx<'a>> {
        let def = self.definition_of(inst)?;
        Ok(Ctx {
            inst,
            def,
            compensation_retry: self.compensation_retry,
            now_ms: now_ms(),
            fx: Effects::default(),
            rng: fastrand::Rng::new(),
            signals: BTreeMap::new(),
        })
    }

    /// The data a start of saga `name` stores: `data` itself, or for a planned saga
    /// `{"input", "plan", "results"}` with its plan checked.
    fn prepare(&self, name: &str, version: i32, data: Value) -> Result<Value> {
        let def = self.defs.get(&(name.to_owned(), version));
        if let Some(input) = def.and_then(|d| d.input.as_ref()) {
            input.check(&data)?;
        }
        let Some(planned) = def.and_then(|d| d.planned.as_ref()) else {
            return Ok(data);
        };
        if planned.planner.is_some() {
            return crate::plan::initial_data(data, None);
        }
        let start: crate::PlanStart = serde_json::from_value(data).map_err(|e| {
            Error::InvalidPlan(format!(
                "saga `{name}` has no planner step: start it with a plan and its input \
                 (PlanStart, {{\"plan\": …, \"input\": …}}): {e}"
            ))
        })?;
        planned.catalog.validate(&start.plan)?;
        crate::plan::initial_data(start.input, Some(&start.plan))
    }

    /// Starts saga `name` (its newest registered version) with `data`, in `tx`: the
    /// instance, its first step(s) as dispatched, their compensation-ledger entries and
    /// command messages are written together, or not at all.
    ///
    /// # Errors
    /// [`Error::UnknownSaga`] for an unregistered name; [`Error::Data`] if `data` does
    /// not serialize; store errors.
    pub async fn start<D: Serialize>(&self, tx: &mut Tx, name: &str, data: &D) -> Result<SagaId> {
        self.start_json(tx, name, serde_json::to_value(data)?).await
    }

    /// [`start`](Self::start) with the data already as JSON.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_json(&self, tx: &mut Tx, name: &str, data: Value) -> Result<SagaId> {
        Ok(self.accept(tx, name, data).await?.id())
    }

    /// Starts saga `name` now if its admission bound leaves room and no earlier start
    /// waits; otherwise stores the start to be started, in order, when there is room.
    /// Either way the saga exists exactly when `tx` commits, and never is dropped.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn accept(&self, tx: &mut Tx, name: &str, data: Value) -> Result<Accepted> {
        self.accept_keyed(tx, name, None, data).await
    }

    /// [`accept`](Self::accept) with the caller's idempotency key: the first start of
    /// `name` with `key` starts (or queues) a saga and records the key with it, in
    /// `tx`; every later one, also from another process or racing in another
    /// transaction, writes nothing and answers [`Accepted::Existing`] with the first
    /// saga's id. `None` is a start without a key.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for an empty key or one over 256 bytes (nothing written);
    /// as [`start`](Self::start).
    pub async fn accept_keyed(
        &self,
        tx: &mut Tx,
        name: &str,
        key: Option<&str>,
        data: Value,
    ) -> Result<Accepted> {
        let version = self.version_of(name)?;
        let data = self.prepare(name, version, data)?;
        let id = SagaId::new();
        if let Some(key) = key {
            if key.is_empty() || key.len() > MAX_KEY_BYTES {
                return Err(Error::InvalidKey {
                    key: key.chars().take(64).collect(),
                    reason: format!("a key is 1 to {MAX_KEY_BYTES} bytes"),
                });
            }
            if let Some(existing) = admission::claim_key(tx.conn(), name, key, id, now_ms()).await?
            {
                return Ok(Accepted::Existing(existing));
            }
        }
        if let Some(bound) = self.max_in_flight(name)
            && (admission::any_waiting(tx.conn(), name).await?
                || self.in_flight_estimate(tx, name).await? >= bound as u64)
        {
            // Checked in full now, not when its turn comes: a start that cannot begin
            // is refused here, with nothing written.
            if let Err(e) = self.check_start(tx.store(), id, name, version, &data) {
                if let Some(key) = key {
                    admission::release_key(tx.conn(), name, key).await?;
                }
                return Err(e);
            }
            let mut headers = Headers::new();
            agentsaga_core::propagation::inject_current(&mut headers);
            admission::push(tx.conn(), id, name, &data, &headers, now_ms()).await?;
            tracing::debug!(saga.id = %id, saga.name = %name, "saga start waits for room");
            return Ok(Accepted::Waiting(id));
        }
        self.start_now(tx, id, name, version, data, 0, None).await?;
        if let Some(seen) = self
            .in_flight_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_mut(name)
        {
            seen.1 += 1;
        }
        Ok(Accepted::Started(id))
    }

    /// [`accept`](Self::accept) for many starts of saga `name` in `tx`, decided in
    /// order as that many `accept`s would be (the starts past the admission bound
    /// wait, in order), but written in a few statements for the lot instead of a few
    /// per saga: the instances in one, their first steps in one, their first messages
    /// in one batch (SQLite: all three in one round trip). Each saga's first messages
    /// carry the trace context of an `outbox.enqueue` span of their own under the
    /// saga's `saga.start`, so each saga is one trace as when started alone (the
    /// batch's own enqueue span stands apart). The answers come in the order of `data`.
    ///
    /// # Errors
    /// As [`start`](Self::start); a `data` that fails its saga's checks fails the
    /// whole call before anything is written.
    pub async fn accept_many(
        &self,
        tx: &mut Tx,
        name: &str,
        data: Vec<Value>,
    ) -> Result<Vec<Accepted>> {
        let version = self.version_of(name)?;
        let data = data
            .into_iter()
            .map(|d| self.prepare(name, version, d))
            .collect::<Result<Vec<_>>>()?;
        let room = match self.max_in_flight(name) {
            None => data.len(),
            Some(_) if data.is_empty() => 0,
            Some(bound) => {
                if admission::any_waiting(tx.conn(), name).await? {
                    0
                } else {
                    let n = self.in_flight_estimate(tx, name).await?;
                    usize::try_from((bound as u64).saturating_sub(n)).unwrap_or(usize::MAX)
                }
            }
        };
        let mut accepted = Vec::with_capacity(data.len());
        let mut insts = Vec::new();
        let mut waits = Vec::new();
        let mut send = Vec::new();
        let mut later = Vec::new();
        for data in data {
            let id = SagaId::new();
            if insts.len() >= room {
                self.check_start(tx.store(), id, name, version, &data)?;
                later.push((id, data));
                accepted.push(Accepted::Waiting(id));
                continue;
            }
            let (inst, mut fx, span) = self.begin_instance(id, name, version, data, 0, None)?;
            span.in_scope(|| agentsaga_core::propagation::stamp_enqueue(&mut fx.send));
            if !fx.waits.is_empty() {
                waits.push((id, fx.waits));
            }
            send.extend(fx.send);
            insts.push(inst);
            accepted.push(Accepted::Started(id));
        }
        persist::insert_new(tx, &insts, &waits, now_ms(), &send).await?;
        for (id, data) in &later {
            let mut headers = Headers::new();
            agentsaga_core::propagation::inject_current(&mut headers);
            admission::push(tx.conn(), *id, name, data, &headers, now_ms()).await?;
        }
        if !later.is_empty() {
            tracing::debug!(saga.name = %name, waiting = later.len(), "saga starts wait for room");
        }
        if let Some(seen) = self
            .in_flight_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_mut(name)
        {
            seen.1 += insts.len() as u64;
        }
        Ok(accepted)
    }

    /// Sagas of `name` in flight, as a start decides on it: counted in `tx` at most
    /// every [`IN_FLIGHT_FRESH`], and in between the last count plus the starts made
    /// here since (sagas finished meanwhile are noticed at the next count). Counting
    /// on every start cost PostgreSQL a scan of up to `bound` index entries per start.
    async fn in_flight_estimate(&self, tx: &mut Tx, name: &str) -> Result<u64> {
        let now = std::time::Instant::now();
        let cached = self
            .in_flight_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .copied();
        if let Some((at, n)) = cached
            && now.duration_since(at) < IN_FLIGHT_FRESH
        {
            return Ok(n);
        }
        let n = admission::in_flight(tx.conn(), name).await?;
        self.in_flight_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_owned(), (now, n));
        Ok(n)
    }

    /// Starts saga `name` now if its admission bound leaves room and no earlier start
    /// waits; otherwise writes nothing and answers [`Error::Busy`].
    ///
    /// # Errors
    /// [`Error::Busy`]; as [`start`](Self::start).
    pub async fn try_start_json(&self, tx: &mut Tx, name: &str, data: Value) -> Result<SagaId> {
        let version = self.version_of(name)?;
        let data = self.prepare(name, version, data)?;
        if let Some(bound) = self.max_in_flight(name) {
            let in_flight = admission::in_flight(tx.conn(), name).await?;
            if in_flight >= bound as u64 || admission::any_waiting(tx.conn(), name).await? {
                return Err(Error::Busy {
                    name: name.to_owned(),
                    in_flight,
                    bound,
                });
            }
        }
        let id = SagaId::new();
        self.start_now(tx, id, name, version, data, 0, None).await?;
        Ok(id)
    }

    /// Starts, in `tx`, as many waiting starts of saga `name` as its bound has room
    /// for, oldest first; returns their ids. The runtime calls it as sagas finish.
    ///
    /// A start that cannot begin (its data no longer decodes as the saga's input, its
    /// first command is over the size limit: say, after a deploy changed the saga) is
    /// set aside in `saga_starts` with the reason, in `tx`, and the starts behind it
    /// go on; see [`set_aside_starts`](Self::set_aside_starts).
    ///
    /// # Errors
    /// Store errors.
    pub async fn admit(&self, tx: &mut Tx, name: &str) -> Result<Vec<SagaId>> {
        let Some(bound) = self.max_in_flight(name) else {
            return Ok(Vec::new());
        };
        let version = self.version_of(name)?;
        let (_, waiting) = admission::pop(tx.conn(), name, bound as u64, now_ms()).await?;
        let mut ids = Vec::with_capacity(waiting.len());
        for w in waiting {
            let begun = self
                .prepare_input(name, version, &w.data)
                .and_then(|()| {
                    self.begin_instance(
                        w.id,
                        name,
                        version,
                        w.data.clone(),
                        w.waited_ms,
                        Some(&w.headers),
                    )
                })
                .and_then(|(inst, fx, span)| {
                    for m in &fx.send {
                        tx.store().check_message(m)?;
                    }
                    Ok((inst, fx, span))
                });
            match begun {
                Ok((inst, fx, span)) => {
                    self.write(tx, &inst, None, fx).instrument(span).await?;
                    ids.push(w.id);
                }
                Err(e) => {
                    tracing::warn!(
                        saga.id = %w.id, saga.name = %name, error = %e,
                        "a waiting start cannot be started: set aside (see `agentsaga starts list`)"
                    );
                    admission::set_aside(tx.conn(), name, &w, &e.to_string(), now_ms()).await?;
                }
            }
        }
        Ok(ids)
    }

    /// Would [`admit`](Self::admit) start anything for saga `name` now? Two reads,
    /// outside any transaction: starts wait, and the room under the bound is at least
    /// one admission batch.
    ///
    /// # Errors
    /// Store errors.
    pub async fn admission_due(&self, store: &Store, name: &str) -> Result<bool> {
        let Some(bound) = self.max_in_flight(name) else {
            return Ok(false);
        };
        if !admission::any_waiting_now(store, name).await? {
            return Ok(false);
        }
        let in_flight = admission::in_flight_now(store, name).await?;
        Ok(in_flight + admission::min_batch(bound as u64) <= bound as u64)
    }

    /// Starts waiting per saga name (a read).
    ///
    /// # Errors
    /// Store errors.
    pub async fn waiting_starts(store: &Store) -> Result<Vec<(String, u64)>> {
        admission::waiting(store).await
    }

    /// Is `id` a start still waiting for room (a read)?
    ///
    /// # Errors
    /// Store errors.
    pub async fn is_waiting(store: &Store, id: SagaId) -> Result<bool> {
        admission::is_waiting(store, id).await
    }

    /// The waiting starts that could not be started when their turn came and were set
    /// aside, oldest first (a read). They hold nothing up; each stays until an
    /// operator removes it ([`remove_set_aside`](Self::remove_set_aside)).
    ///
    /// # Errors
    /// Store errors; [`Error::Corrupt`] for a row this binary cannot read.
    pub async fn set_aside_starts(store: &Store) -> Result<Vec<SetAsideStart>> {
        Ok(admission::set_aside_rows(store, None)
            .await?
            .into_iter()
            .map(SetAsideStart::from)
            .collect())
    }

    /// The start `id`, if it was set aside (a read).
    ///
    /// # Errors
    /// As [`set_aside_starts`](Self::set_aside_starts).
    pub async fn set_aside_start(store: &Store, id: SagaId) -> Result<Option<SetAsideStart>> {
        Ok(admission::set_aside_rows(store, Some(id))
            .await?
            .into_iter()
            .next()
            .map(SetAsideStart::from))
    }

    /// Operator: deletes the set-aside start `id`, in `tx`, with the idempotency key
    /// that named it (a later start with that key starts afresh). Needs no saga
    /// definition.
    ///
    /// # Errors
    /// [`Error::NotFound`] if no start `id` is set aside (a start still waiting its
    /// turn is not removed); store errors.
    pub async fn remove_set_aside(tx: &mut Tx, id: SagaId) -> Result<()> {
        if admission::remove_set_aside(tx.conn(), id).await? {
            Ok(())
        } else {
            Err(Error::NotFound(id))
        }
    }

    /// Why re-driving the dead letter `env` would be wrong, if it would: a saga
    /// command or compensation whose saga has moved past it (finished, compensating or
    /// compensated that step, or sent a later attempt), or a message of a saga that no
    /// longer exists. `None`: not a saga message, or still wanted. An undo must never
    /// be overtaken by its do.
    ///
    /// # Errors
    /// Store errors; [`Error::Corrupt`] for a saga row this binary cannot read.
    pub async fn moot(store: &Store, env: &Envelope) -> Result<Option<String>> {
        let Ok(saga) = protocol::saga_id(env) else {
            return Ok(None);
        };
        let inst = store
            .read(async |c| Ok(persist::load(c, saga).await))
            .await??;
        let Some(inst) = inst else {
            return Ok(Some(format!("its saga {saga} no longer exists")));
        };
        let sent = Outbound::parse(env).and_then(|o| match o {
            Outbound::Command { step } | Outbound::Compensation { step } => {
                inst.steps.get(&step).map(|row| (o, row))
            }
        });
        Ok(match sent {
            Some((Outbound::Command { .. }, row)) => {
                if row.command_id != Some(env.id) {
                    Some(format!(
                        "step `{}` was sent again since (a later attempt supersedes it)",
                        row.name
                    ))
                } else if inst.state != SagaState::Running {
                    Some(format!(
                        "its saga is {}: the step may not run now",
                        inst.state
                    ))
                } else {
                    None
                }
            }
            Some((Outbound::Compensation { .. }, row)) => {
                if row.compensation_message_id != Some(env.id) {
                    Some(format!(
                        "the compensation of step `{}` was sent again since",
                        row.name
                    ))
                } else if matches!(
                    row.compensation_state,
                    Some(crate::CompensationState::Done | crate::CompensationState::Skipped)
                ) {
                    Some(format!("step `{}` is compensated already", row.name))
                } else {
                    None
                }
            }
            None if inst.state.is_terminal() => Some(format!("its saga is {}", inst.state)),
            None => None,
        })
    }

    fn version_of(&self, name: &str) -> Result<i32> {
        self.latest
            .get(name)
            .copied()
            .ok_or_else(|| Error::UnknownSaga(name.to_owned()))
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_now(
        &self,
        tx: &mut Tx,
        id: SagaId,
        name: &str,
        version: i32,
        data: Value,
        waited_ms: i64,
        parent: Option<&Headers>,
    ) -> Result<()> {
        let (inst, fx, span) = self.begin_instance(id, name, version, data, waited_ms, parent)?;
        self.write(tx, &inst, None, fx).instrument(span).await
    }

    /// A new instance `id` of saga `name` and the effects of its start, decided in its
    /// `saga.start` span (a child of the context in `parent`, if any), which is
    /// returned: the start's writes belong in it.
    fn begin_instance(
        &self,
        id: SagaId,
        name: &str,
        version: i32,
        data: Value,
        waited_ms: i64,
        parent: Option<&Headers>,
    ) -> Result<(Instance, Effects, tracing::Span)> {
        let span = tracing::info_span!(
            "saga.start",
            saga.id = %id,
            saga.name = %name,
            saga.version = version,
            waited_ms,
            otel.kind = "producer",
        );
        if let Some(headers) = parent {
            agentsaga_core::propagation::adopt(&span, headers);
        }
        let (inst, fx) = span.in_scope(|| self.decide_start(id, name, version, data, waited_ms))?;
        Ok((inst, fx, span))
    }

    /// A new instance `id` of saga `name` and the effects of its start: decided, no
    /// I/O.
    fn decide_start(
        &self,
        id: SagaId,
        name: &str,
        version: i32,
        data: Value,
        waited_ms: i64,
    ) -> Result<(Instance, Effects)> {
        let mut inst = Instance {
            id,
            name: name.to_owned(),
            version,
            state: SagaState::Running,
            data,
            error: None,
            stage: 0,
            steps: BTreeMap::new(),
            finished: false,
        };
        let mut ctx = self.ctx(&mut inst)?;
        ctx.start(std::time::Duration::from_millis(waited_ms.max(0) as u64))?;
        let fx = std::mem::take(&mut ctx.fx);
        Ok((inst, fx))
    }

    /// Could start `id` of saga `name` with (prepared) `data` begin on `store`? Its
    /// first step(s) decided as a start would, and every message it would write
    /// checked as an enqueue would check it. No I/O: for a start stored to begin
    /// later, which must not fail then.
    fn check_start(
        &self,
        store: &Store,
        id: SagaId,
        name: &str,
        version: i32,
        data: &Value,
    ) -> Result<()> {
        let (_, fx) = self.decide_start(id, name, version, data.clone(), 0)?;
        for m in &fx.send {
            store.check_message(m)?;
        }
        Ok(())
    }

    /// The input check of [`prepare`](Self::prepare) on stored (prepared) data: does it
    /// still decode as the typed saga's input (a deploy may have changed it)?
    fn prepare_input(&self, name: &str, version: i32, data: &Value) -> Result<()> {
        match self
            .defs
            .get(&(name.to_owned(), version))
            .and_then(|d| d.input.as_ref())
        {
            Some(input) => input.check(data),
            None => Ok(()),
        }
    }

    /// The signals saga `inst` has received, if its definition waits for any (no
    /// read otherwise).
    async fn signals_of(
        &self,
        tx: &mut Tx,
        inst: &Instance,
    ) -> Result<BTreeMap<String, protocol::StepOutcome>> {
        let waits = self
            .defs
            .get(&(inst.name.clone(), inst.version))
            .is_some_and(|d| d.is_planned() || !d.waits().is_empty());
        if !waits {
            return Ok(BTreeMap::new());
        }
        signals::received(tx.conn(), inst.id).await
    }

    async fn write(
        &self,
        tx: &mut Tx,
        inst: &Instance,
        before: Option<&Instance>,
        fx: Effects,
    ) -> Result<()> {
        let span = match &fx.compensating {
            Some(step) => tracing::info_span!(
                "saga.compensate",
                saga.id = %inst.id,
                saga.name = %inst.name,
                step.name = %step,
                otel.kind = "producer",
            ),
            None => tracing::Span::none(),
        };
        self.write_effects(tx, inst, before, fx)
            .instrument(span)
            .await
    }

    async fn write_effects(
        &self,
        tx: &mut Tx,
        inst: &Instance,
        before: Option<&Instance>,
        fx: Effects,
    ) -> Result<()> {
        let mut saved = before;
        if !fx.waits.is_empty() {
            // The waits' rows refer to the instance: saved first (the save below then
            // has nothing left to write).
            persist::save(tx, inst, before, now_ms()).await?;
            signals::register(tx.conn(), inst.id, &fx.waits).await?;
            saved = Some(inst);
        }
        tx.cancel_pending(&fx.cancel).await?;
        // On SQLite, the save and the messages in one round trip.
        persist::save_and_enqueue(tx, inst, saved, now_ms(), &fx.send).await
    }

    /// Handles one message delivered to an orchestrator destination — a reply, a
    /// timeout, a dead-letter notice, a deadline — in `tx`, with the inbox record that
    /// makes it effectively-once.
    ///
    /// # Errors
    /// [`Error::VersionNotRegistered`] when the saga's version is not registered here
    /// (roll back and let a process that has it take the message);
    /// [`Error::Malformed`] for a message without the saga headers;
    /// [`Error::IllegalTransition`] if deciding meets a transition the lifecycle table
    /// lacks (nothing of it is written: roll `tx` back); store errors.
    pub async fn handle(&self, tx: &mut Tx, env: &Envelope) -> Result<Handled> {
        if tx.receive(&env.destination, env.id).await? == Receipt::Duplicate {
            return Ok(Handled::Duplicate);
        }
        self.advance(tx, env).await
    }

    /// Does an orchestrator of this engine consume `destination`?
    pub fn consumes(&self, destination: &str) -> bool {
        self.definitions()
            .any(|d| d.orchestrator_destination() == destination)
    }

    /// Applies `answer` — a reply or timeout notice an agent of this process is about
    /// to commit for one of this engine's sagas — in the agent's own transaction `tx`,
    /// instead of sending it through the outbox: the step's outcome, the saga's next
    /// messages and the agent's effects commit together, and the answer never becomes
    /// a row, a delivery or an inbox record (nothing can deliver it twice).
    ///
    /// `Ok(None)`, with nothing written, when `answer` is not for this engine (another
    /// destination, a delay, a key) or its saga's version is not registered here: send
    /// it through the outbox as usual.
    ///
    /// # Errors
    /// As [`handle`](Self::handle). Some statements may have run: roll `tx` back.
    pub async fn apply_local(&self, tx: &mut Tx, answer: &Message) -> Result<Option<Handled>> {
        self.apply_local_prefetched(tx, answer, None).await
    }

    /// The read of saga `saga` that an agent's hop may start with (see
    /// [`Store::hop_receiving_prefetched`](agentsaga_core::Store::hop_receiving_prefetched)),
    /// so that [`apply_local_prefetched`](Self::apply_local_prefetched) needs no load of
    /// its own: on SQLite in the hop's opening round trip, on PostgreSQL by the set lane
    /// for all the sagas of its batch (see
    /// [`Prefetch::with_set`](agentsaga_core::Prefetch::with_set)).
    pub fn prefetch(&self, saga: SagaId) -> Option<Prefetch> {
        persist::prefetch(saga)
    }

    /// [`apply_local`](Self::apply_local) with the saga as `read` found it when the hop
    /// opened ([`prefetch`](Self::prefetch) of `saga`), instead of a load of its own.
    /// The hop must not have written the saga's rows since. A read of another saga than
    /// the answer's is not used.
    ///
    /// # Errors
    /// As [`apply_local`](Self::apply_local).
    pub async fn apply_local_prefetched(
        &self,
        tx: &mut Tx,
        answer: &Message,
        read: Option<(SagaId, &Prefetched)>,
    ) -> Result<Option<Handled>> {
        if !answer.delay.is_zero() || answer.key.is_some() || !self.consumes(&answer.destination) {
            return Ok(None);
        }
        let env = protocol::envelope(answer);
        let loaded = match read {
            Some((saga, read)) if protocol::saga_id(&env).ok() == Some(saga) => {
                persist::prefetched(saga, read)?
            }
            _ => None,
        };
        match self.advance_loaded(tx, &env, loaded).await {
            Ok(handled) => Ok(Some(handled)),
            // Raised after reading the saga, before writing anything.
            Err(Error::VersionNotRegistered { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`handle`](Self::handle) past the inbox: reads the saga, decides, writes.
    async fn advance(&self, tx: &mut Tx, env: &Envelope) -> Result<Handled> {
        self.advance_loaded(tx, env, None).await
    }

    /// [`advance`](Self::advance) with the saga already read (`Some(None)`: it does
    /// not exist), or `None` to load it.
    async fn advance_loaded(
        &self,
        tx: &mut Tx,
        env: &Envelope,
        loaded: Option<Option<Instance>>,
    ) -> Result<Handled> {
        let saga = protocol::saga_id(env)?;
        // Parsed now, and refused only once its saga is known to be here: a message of
        // a saga that no longer exists is dropped, and one of a version this process
        // lacks is left for a process that has it, whatever else is wrong with it.
        let inbound = Inbound::parse(env);
        let loaded = match loaded {
            Some(loaded) => loaded,
            None => persist::load(tx.conn(), saga).await?,
        };
        let Some(mut inst) = loaded else {
            tracing::warn!(saga.id = %saga, message.id = %env.id, "message for an unknown saga; dropped");
            return Ok(Handled::Ignored(format!("unknown saga {saga}")));
        };
        if !self.has(&inst.name, inst.version) {
            return Err(Error::VersionNotRegistered {
                name: inst.name,
                version: inst.version,
            });
        }
        let inbound = inbound?;
        // A start timeout withdraws its command only if no agent has taken it: a
        // command claimed (or answered) in time is left to finish, and a committed
        // reply wins.
        let started_in_time = match inbound {
            Inbound::StartTimeout { step, causation } => {
                (tx.cancel_pending(&[causation]).await? != 1).then_some(step)
            }
            _ => None,
        };
        let before = inst.clone();
        let signals = self.signals_of(tx, &inst).await?;
        let mut ctx = self.ctx(&mut inst)?;
        ctx.signals = signals;
        match started_in_time {
            Some(step) => ctx.ignore(format!("step {step} started in time"))?,
            None => ctx.receive(inbound)?,
        }
        let fx = std::mem::take(&mut ctx.fx);
        self.finish_handle(tx, saga, inst, before, fx).await
    }

    async fn finish_handle(
        &self,
        tx: &mut Tx,
        saga: SagaId,
        inst: Instance,
        before: Instance,
        fx: Effects,
    ) -> Result<Handled> {
        if let Some(why) = &fx.ignored {
            tracing::info!(saga.id = %saga, %why, "saga message ignored");
        }
        let ignored = fx.ignored.clone();
        self.write(tx, &inst, Some(&before), fx).await?;
        Ok(match ignored {
            Some(why) if inst == before => Handled::Ignored(why),
            _ => Handled::Advanced {
                saga,
                state: inst.state,
            },
        })
    }

    /// The orchestrator could not process `env` (its effects were rolled back): tells
    /// the saga, in `tx`, instead of leaving it waiting for an answer that will not
    /// come. The message is recorded in the inbox; the step it concerns fails with
    /// `reason` (before the pivot the saga compensates, after it the saga is stuck);
    /// a saga that was compensating is stuck.
    ///
    /// # Errors
    /// [`Error::Malformed`] without a saga id; [`Error::VersionNotRegistered`]; store
    /// errors.
    pub async fn fail(&self, tx: &mut Tx, env: &Envelope, reason: &str) -> Result<Handled> {
        if tx.receive(&env.destination, env.id).await? == Receipt::Duplicate {
            return Ok(Handled::Duplicate);
        }
        let saga = protocol::saga_id(env)?;
        let Some(mut inst) = persist::load(tx.conn(), saga).await? else {
            return Ok(Handled::Ignored(format!("unknown saga {saga}")));
        };
        if !self.has(&inst.name, inst.version) {
            return Err(Error::VersionNotRegistered {
                name: inst.name,
                version: inst.version,
            });
        }
        let step = protocol::step_of(env);
        let before = inst.clone();
        let mut ctx = self.ctx(&mut inst)?;
        ctx.fail_processing(step, format!("the orchestrator could not go on: {reason}"))?;
        let fx = std::mem::take(&mut ctx.fx);
        self.finish_handle(tx, saga, inst, before, fx).await
    }

    /// Sends signal `name` to saga `id`, in `tx`: recorded in `saga_signals` and
    /// delivered to the saga's orchestrator when `tx` commits. A saga waiting for it
    /// goes on; one that has not reached its wait yet uses it when it does; a second
    /// signal for a wait that has had one changes nothing ([`SignalReceipt::Duplicate`]).
    /// Needs no saga definition (the CLI sends signals).
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown saga; [`Error::SignalRefused`] for a finished
    /// saga or a name it never waits for (nothing written either way); store errors.
    pub async fn signal(
        tx: &mut Tx,
        id: SagaId,
        name: &str,
        signal: Signal,
    ) -> Result<SignalReceipt> {
        Self::signal_by(tx, id, name, signal, SignalSender::Person).await
    }

    /// [`signal`](Self::signal) as `sender` may send it: an
    /// [`Agent`](SignalSender::Agent) (an LLM-facing surface) may not send the signal of
    /// a wait that is a person's decision ([`Step::approval`](crate::Step::approval),
    /// a plan's `"approval": true`).
    ///
    /// # Errors
    /// As [`signal`](Self::signal); [`Error::SignalRefused`] for an agent's signal to a
    /// person's decision, with nothing written.
    pub async fn signal_by(
        tx: &mut Tx,
        id: SagaId,
        name: &str,
        signal: Signal,
        sender: SignalSender,
    ) -> Result<SignalReceipt> {
        let outcome = match signal {
            Signal::Approve(value) => protocol::StepOutcome::Ok(value),
            Signal::Reject(reason) => {
                protocol::StepOutcome::Fatal(format!("signal `{name}` rejected: {reason}"))
            }
        };
        let (receipt, wake) =
            signals::record(tx.conn(), id, name, &outcome, sender, now_ms()).await?;
        if let Some(wake) = wake {
            tx.enqueue(&wake).await?;
        }
        Ok(receipt)
    }

    /// Operator: abort a running saga (compensate what it did), or give up on one
    /// stuck after its pivot (`aborted`).
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::WrongState`] saying why, with nothing changed;
    /// [`Error::IllegalTransition`] as in [`handle`](Self::handle).
    pub async fn abort(&self, tx: &mut Tx, id: SagaId) -> Result<SagaState> {
        self.operate(tx, id, |c| c.abort()).await
    }

    /// Operator: retry a stuck saga (its failed compensation, or its failed step after
    /// the pivot).
    ///
    /// # Errors
    /// As [`abort`](Self::abort).
    pub async fn retry(&self, tx: &mut Tx, id: SagaId) -> Result<SagaState> {
        self.operate(tx, id, |c| c.retry()).await
    }

    /// Operator: mark a stuck compensation done by hand (recorded as skipped) and go on.
    ///
    /// # Errors
    /// As [`abort`](Self::abort).
    pub async fn skip(&self, tx: &mut Tx, id: SagaId) -> Result<SagaState> {
        self.operate(tx, id, |c| c.skip()).await
    }

    async fn operate(
        &self,
        tx: &mut Tx,
        id: SagaId,
        op: impl FnOnce(&mut Ctx<'_>) -> Result<()>,
    ) -> Result<SagaState> {
        let mut inst = persist::load(tx.conn(), id)
            .await?
            .ok_or(Error::NotFound(id))?;
        let before = inst.clone();
        let signals = self.signals_of(tx, &inst).await?;
        let mut ctx = self.ctx(&mut inst)?;
        ctx.signals = signals;
        op(&mut ctx)?;
        let fx = std::mem::take(&mut ctx.fx);
        self.write(tx, &inst, Some(&before), fx).await?;
        Ok(inst.state)
    }
}

pub(crate) use agentsaga_core::clock::now_ms;
