//! The saga engine: starts sagas and advances them, one transaction per event, on the
//! store's tables. It decides; the runtime's actors drive it.

mod admission;
mod child;
mod handle;
mod logic;
mod model;
mod operate;
mod persist;
mod signals;
mod start;
mod tree;
mod waiting;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use agentsaga_core::read::{Prefetch, Prefetched};
use agentsaga_core::{Envelope, Headers, Message, Receipt, RetryPolicy, Store, Tx};
use serde::Serialize;
use serde_json::Value;
use tracing::Instrument;

use self::logic::{Ctx, Effects};
use self::model::Instance;
pub use self::signals::{Signal, SignalReceipt, SignalSender};
pub(crate) use crate::definition::DeclaredWait;
use crate::protocol::{self, Inbound, Outbound};
use crate::{Error, Result, SagaDefinition, SagaId, SagaState};
#[cfg(test)]
pub(crate) use child::child_id;
pub(crate) use model::PauseRecord;

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

/// How deep child sagas may nest unless configured otherwise: a saga started on its
/// own is at depth 0, its children at 1 ([`Engine::with_child_limits`]).
pub const DEFAULT_MAX_CHILD_DEPTH: u32 = 4;

/// How many child sagas one saga may start unless configured otherwise
/// ([`Engine::with_child_limits`]).
pub const DEFAULT_MAX_CHILDREN: u32 = 64;

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
    /// Child sagas: the deepest nesting and the most children of one saga.
    max_child_depth: u32,
    max_children: u32,
}

/// How long a start may trust the in-flight count an earlier start read.
const IN_FLIGHT_FRESH: std::time::Duration = std::time::Duration::from_millis(100);

impl Engine {
    /// An engine running `definitions`. Several versions of one saga may be registered:
    /// new instances use the highest, running ones finish on their own.
    ///
    /// # Errors
    /// [`Error::InvalidDefinition`] if a name and version appear twice, or a step runs
    /// a child saga ([`Step::saga`](crate::Step::saga)) that is not registered, or that
    /// has a pivot while the step is undone by compensating it (see `Step::saga`).
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
        check_children(&defs, &latest)?;
        Ok(Self {
            defs: Arc::new(defs),
            latest: Arc::new(latest),
            compensation_retry: RetryPolicy::default(),
            max_in_flight: None,
            max_in_flight_for: Arc::default(),
            in_flight_seen: Arc::default(),
            max_child_depth: DEFAULT_MAX_CHILD_DEPTH,
            max_children: DEFAULT_MAX_CHILDREN,
        })
    }

    /// Bounds on child sagas ([`Step::saga`](crate::Step::saga)): at most `depth`
    /// levels below a saga started on its own, and at most `children` child sagas
    /// started by one saga. A child start beyond either is refused before anything
    /// of it is written: the parent's step fails (fatal) with the reason, and the
    /// parent turns back. Defaults: [`DEFAULT_MAX_CHILD_DEPTH`],
    /// [`DEFAULT_MAX_CHILDREN`].
    pub fn with_child_limits(mut self, depth: u32, children: u32) -> Self {
        self.max_child_depth = depth;
        self.max_children = children;
        self
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
            .chain(
                self.latest
                    .keys()
                    .map(|name| crate::child_destination(name)),
            )
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
    pub(super) fn definition_of(&self, inst: &Instance) -> Result<Option<Arc<SagaDefinition>>> {
        self.defs
            .get(&(inst.name.clone(), inst.version))
            .map(|d| d.for_data(&inst.data))
            .transpose()
    }

    pub(super) fn ctx<'a>(&'a self, inst: &'a mut Instance, now_ms: i64) -> Result<Ctx<'a>> {
        let def = self.definition_of(inst)?;
        Ok(Ctx {
            inst,
            def,
            compensation_retry: self.compensation_retry,
            now_ms,
            fx: Effects::default(),
            rng: fastrand::Rng::new(),
            signals: BTreeMap::new(),
            spenders: Vec::new(),
        })
    }

    /// The data a start of saga `name` stores: `data` itself, or for a planned saga
    /// `{"input", "plan", "results"}` with its plan checked.
    pub(crate) fn prepare(&self, name: &str, version: i32, data: Value) -> Result<Value> {
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
        let plan = planned.catalog.accept(start.plan)?;
        crate::plan::initial_data(start.input, Some(&plan))
    }
}

/// The child steps of `defs` ([`Step::saga`](crate::Step::saga)) run registered sagas,
/// and a child step undone by compensating its child runs a child without a pivot (one
/// past its pivot cannot be undone).
fn check_children(
    defs: &HashMap<(String, i32), Arc<SagaDefinition>>,
    latest: &HashMap<String, i32>,
) -> Result<()> {
    for def in defs.values() {
        let allowed = def.planned.iter().flat_map(|p| p.catalog.sagas.iter());
        for (child, has_pivot) in allowed {
            let registered = latest.get(child).map(|v| &defs[&(child.clone(), *v)]);
            match registered {
                None => {
                    return Err(Error::InvalidDefinition(format!(
                        "planned saga `{}` allows the child saga `{child}`, which is not \
                         registered in this engine",
                        def.name
                    )));
                }
                Some(c) if c.has_pivot() != *has_pivot => {
                    return Err(Error::InvalidDefinition(format!(
                        "planned saga `{}` allows the child saga `{child}` as another \
                         version of it (with or without a pivot) than the one registered",
                        def.name
                    )));
                }
                Some(_) => {}
            }
        }
        for step in def.stages.iter().flatten() {
            let Some(child) = &step.child else { continue };
            let Some(version) = latest.get(child) else {
                return Err(Error::InvalidDefinition(format!(
                    "step `{}` of saga `{}` runs the child saga `{child}`, which is not \
                     registered in this engine",
                    step.name, def.name
                )));
            };
            let child_def = &defs[&(child.clone(), *version)];
            if child_def.has_pivot() && step.undo.destination().is_some() {
                return Err(Error::InvalidDefinition(format!(
                    "step `{}` of saga `{}` runs the child saga `{child}`, which has a pivot: \
                     it cannot be undone once past it, so the step must be the pivot or \
                     after it (`Step::saga(..).forward_only()`)",
                    step.name, def.name
                )));
            }
        }
    }
    Ok(())
}
