//! Defining a saga in Rust: typed data, ordered steps, compensations, a pivot,
//! parallel groups, retries and timeouts.
//!
//! The builder checks at compile time that every step before the pivot says how to
//! undo it (or that it has nothing to undo), and that no step after it does:
//!
//! ```compile_fail
//! # use agentsaga_saga::{Saga, Step};
//! # #[derive(serde::Serialize, serde::Deserialize)] struct D;
//! // A step before the pivot without a compensation does not compile.
//! Saga::<D>::builder("s", 1).step(Step::new("a", "agent-a").command(|_: &D| 1));
//! ```
//!
//! ```compile_fail
//! # use agentsaga_saga::{Saga, Step};
//! # #[derive(serde::Serialize, serde::Deserialize)] struct D;
//! // A step after the pivot with a compensation does not compile.
//! Saga::<D>::builder("s", 1)
//!     .pivot(Step::new("p", "agent-p").command(|_: &D| 1))
//!     .step(Step::new("a", "agent-a").command(|_: &D| 1).compensate("agent-a", |_: &D| 2));
//! ```

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::RetryPolicy;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::plan::{Catalog, Planned};
use crate::{Error, Result};

type BuildFn = Arc<dyn Fn(&Value) -> Result<Value> + Send + Sync>;
pub(crate) type FoldFn = Arc<dyn Fn(&mut Value, Value) -> Result<()> + Send + Sync>;
/// Builds a compensation from the saga data and the step's reply (`None`: the step did
/// not succeed). `Err` says why it cannot be built (a reply of another type...).
pub(crate) type UndoFn =
    Arc<dyn Fn(&Value, Option<&Value>) -> std::result::Result<Value, String> + Send + Sync>;

/// Typestate: the step has not said how to undo it.
#[derive(Debug)]
pub enum Open {}
/// Typestate: the step says how to undo it, or that there is nothing to undo.
#[derive(Debug)]
pub enum Undoable {}

/// One step of a saga: the agent it dispatches to, the command built from the saga
/// data, how the reply folds back into the data, and (before the pivot) its
/// compensation.
#[must_use]
pub struct Step<D, U = Open> {
    def: StepDef,
    _marker: PhantomData<fn(D, U)>,
}

/// How a step is undone.
#[derive(Clone)]
pub(crate) enum Undo {
    /// After the pivot, or the pivot itself.
    Never,
    /// Declared: nothing to undo (a read-only step).
    Nothing,
    /// A command to a destination, built from the saga data when the step is
    /// dispatched (and recorded in the ledger then).
    Command { destination: String, build: BuildFn },
    /// A command to a destination, built when the compensation is dispatched, from the
    /// saga data and the step's reply. The ledger records at the step's dispatch that
    /// the step must be undone; the payload is recorded when it is built.
    FromReply { destination: String, build: UndoFn },
}

impl Undo {
    /// Where its compensation goes, if it has one.
    pub(crate) fn destination(&self) -> Option<&str> {
        match self {
            Undo::Never | Undo::Nothing => None,
            Undo::Command { destination, .. } | Undo::FromReply { destination, .. } => {
                Some(destination)
            }
        }
    }
}

/// A step with its types erased: what the engine runs.
#[derive(Clone)]
pub struct StepDef {
    pub(crate) name: String,
    pub(crate) destination: String,
    pub(crate) command: BuildFn,
    pub(crate) fold: Option<FoldFn>,
    pub(crate) undo: Undo,
    pub(crate) retry: RetryPolicy,
    pub(crate) timeout: Option<Duration>,
    pub(crate) start_timeout: Option<Duration>,
    pub(crate) pivot: bool,
    /// A wait for this signal instead of a command (`Step::wait_for`).
    pub(crate) wait: Option<String>,
    /// The wait is a person's decision (`Step::approval`): its signal is taken only
    /// from a person's path, never from an LLM-facing one.
    pub(crate) approval: bool,
}

impl StepDef {
    /// The step's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The agent destination its command goes to.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// Whether it is the saga's pivot.
    pub fn is_pivot(&self) -> bool {
        self.pivot
    }

    /// The signal it waits for, if it is a wait (`Step::wait_for`).
    pub fn waits_for(&self) -> Option<&str> {
        self.wait.as_deref()
    }

    /// Whether it is a wait for a person's decision ([`Step::approval`]).
    pub fn is_approval(&self) -> bool {
        self.approval
    }
}

impl std::fmt::Debug for StepDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepDef")
            .field("name", &self.name)
            .field("destination", &self.destination)
            .field("pivot", &self.pivot)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn data<D: DeserializeOwned>(v: &Value) -> Result<D> {
    Ok(D::deserialize(v)?)
}

impl<D> Step<D, Open>
where
    D: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// A step named `name` that dispatches to the agent at `destination`. Its command
    /// defaults to the whole saga data; set it with [`command`](Self::command).
    pub fn new(name: impl Into<String>, destination: impl Into<String>) -> Self {
        Self {
            def: StepDef {
                name: name.into(),
                destination: destination.into(),
                command: Arc::new(|v: &Value| Ok(v.clone())),
                fold: None,
                undo: Undo::Never,
                retry: RetryPolicy::default(),
                timeout: None,
                start_timeout: None,
                pivot: false,
                wait: None,
                approval: false,
            },
            _marker: PhantomData,
        }
    }

    /// Undo with the command `build(data)` sent to `destination`. It is recorded in the
    /// ledger when the step is dispatched, and must treat "nothing to undo" as success.
    /// To name what the step created, build it from the step's reply with
    /// [`compensate_with`](Self::compensate_with).
    pub fn compensate<C, F>(mut self, destination: impl Into<String>, build: F) -> Step<D, Undoable>
    where
        C: Serialize,
        F: Fn(&D) -> C + Send + Sync + 'static,
    {
        self.def.undo = Undo::Command {
            destination: destination.into(),
            build: Arc::new(move |v: &Value| Ok(serde_json::to_value(build(&data::<D>(v)?))?)),
        };
        Step {
            def: self.def,
            _marker: PhantomData,
        }
    }

    /// Undo with the command `build(data, reply)` sent to `destination`, built when the
    /// compensation is dispatched, so that it can name what the step created (a
    /// reservation id, a calendar event id, a draft id):
    ///
    /// ```
    /// # use agentsaga_saga::{Saga, Step};
    /// # use serde::{Deserialize, Serialize};
    /// # #[derive(Serialize, Deserialize)] struct Trip { day: u32 }
    /// #[derive(Deserialize)]
    /// struct Slot { event_id: String }
    ///
    /// let step = Step::<Trip>::new("book_slot", "calendar")
    ///     .command(|t: &Trip| serde_json::json!({ "book": t.day }))
    ///     .compensate_with("calendar", |t: &Trip, slot: Option<&Slot>| match slot {
    ///         Some(slot) => serde_json::json!({ "cancel": slot.event_id }),
    ///         // Outcome unknown: find what this saga may have booked some other way.
    ///         None => serde_json::json!({ "cancel_any_on": t.day }),
    ///     });
    /// # let _ = Saga::<Trip>::builder("s", 1).step(step).build().unwrap();
    /// ```
    ///
    /// `reply` is the step's reply, decoded as `R`, when the step succeeded before the
    /// saga turned back; `None` when its outcome is unknown: it failed, timed out, was
    /// not started in time, was dead-lettered, or was still in flight when the saga
    /// turned back (its command may yet run: the compensation, which shares its
    /// ordering key, is delivered after it). So the compensation must still treat
    /// "nothing to undo" as success, and for `None` find what the step may have done by
    /// other means (the saga id, the idempotency key).
    ///
    /// The ledger records that the step must be undone, and where to, in the
    /// transaction that dispatches the step, as for [`compensate`](Self::compensate);
    /// the payload is built, and recorded in the ledger, when the compensation is first
    /// dispatched (its retries send that same payload). Building it needs this
    /// definition: a process without it (the `agentsaga` CLI aborting a saga) asks the
    /// saga's orchestrator to build and send it. A reply that succeeded but does not
    /// decode as `R` cannot be undone this way: the compensation fails at once and the
    /// saga is `stuck`, with the reason, for an operator (undo by hand and `skip`).
    pub fn compensate_with<R, C, F>(
        mut self,
        destination: impl Into<String>,
        build: F,
    ) -> Step<D, Undoable>
    where
        R: DeserializeOwned,
        C: Serialize,
        F: Fn(&D, Option<&R>) -> C + Send + Sync + 'static,
    {
        self.def.undo = Undo::FromReply {
            destination: destination.into(),
            build: Arc::new(move |v: &Value, reply: Option<&Value>| {
                let d = data::<D>(v).map_err(|e| format!("the saga data does not decode: {e}"))?;
                let reply = reply.map(R::deserialize).transpose().map_err(|e| {
                    format!(
                        "the step's reply does not decode as `{}`: {e}",
                        std::any::type_name::<R>()
                    )
                })?;
                serde_json::to_value(build(&d, reply.as_ref()))
                    .map_err(|e| format!("the compensation does not encode: {e}"))
            }),
        };
        Step {
            def: self.def,
            _marker: PhantomData,
        }
    }

    /// Declares that this step changes nothing that would need undoing.
    pub fn nothing_to_undo(mut self) -> Step<D, Undoable> {
        self.def.undo = Undo::Nothing;
        Step {
            def: self.def,
            _marker: PhantomData,
        }
    }
}

impl<D, U> Step<D, U>
where
    D: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// A step that waits for the signal `name` (a person's approval, an outside event)
    /// instead of sending a command: the saga parks there, holding nothing, until
    /// `Runtime::signal(id, name, …)` (or `agentsaga sagas signal`) sends it. An
    /// approval's payload folds into the data through [`on_reply`](Self::on_reply); a
    /// rejection fails the step (before the pivot the saga compensates, at or after it
    /// the saga is stuck), and so does its [`timeout`](Self::timeout), counted from
    /// when the saga reaches the wait. A signal sent before the saga gets there is kept
    /// and used when it does. A wait has nothing to undo, so it stands before the pivot
    /// or after it as it is.
    pub fn wait_for(name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            def: StepDef {
                destination: format!("signal:{name}"),
                name: name.clone(),
                command: Arc::new(|_: &Value| Ok(Value::Null)),
                fold: None,
                undo: Undo::Nothing,
                retry: RetryPolicy::default(),
                timeout: None,
                start_timeout: None,
                pivot: false,
                wait: Some(name),
                approval: false,
            },
            _marker: PhantomData,
        }
    }

    /// A wait for the signal `name` that only a person may send: a person's decision
    /// (approve a payment, an email). It is a [`wait_for`](Self::wait_for) in every
    /// way, except where its signal may come from: the application's own code
    /// (`Runtime::signal`), `agentsaga sagas signal` and the console's API and page
    /// take it; an LLM-facing surface (the MCP tools) never does, whatever it is
    /// allowed ([`Engine::signal_by`](crate::Engine::signal_by) with
    /// [`SignalSender::Agent`](crate::SignalSender::Agent) is refused).
    pub fn approval(name: impl Into<String>) -> Self {
        let mut step = Self::wait_for(name);
        step.def.approval = true;
        step
    }

    /// The command sent to the agent, built from the saga data.
    pub fn command<C, F>(mut self, build: F) -> Self
    where
        C: Serialize,
        F: Fn(&D) -> C + Send + Sync + 'static,
    {
        self.def.command =
            Arc::new(move |v: &Value| Ok(serde_json::to_value(build(&data::<D>(v)?))?));
        self
    }

    /// Folds the agent's reply into the saga data. A reply that does not decode into
    /// `R` fails the step (fatal).
    pub fn on_reply<R, F>(mut self, fold: F) -> Self
    where
        R: DeserializeOwned,
        F: Fn(&mut D, R) + Send + Sync + 'static,
    {
        self.def.fold = Some(Arc::new(move |v: &mut Value, reply: Value| {
            let mut d: D = data(v)?;
            fold(&mut d, R::deserialize(reply)?);
            *v = serde_json::to_value(d)?;
            Ok(())
        }));
        self
    }

    /// How retryable failures are retried (default: 1 s doubling to 60 s, 10 attempts).
    /// Steps after the pivot retry without a budget.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.def.retry = policy;
        self
    }

    /// How long the agent may work on one attempt, counted from the moment it starts
    /// handling the command (not from dispatch: time spent waiting in a backlog does
    /// not count, so overload costs time, never a timed-out step). Past it the agent's
    /// work is cancelled and the outcome is unknown: before the pivot the step is
    /// compensated, at or after it the command is sent again.
    ///
    /// The agent enforces it (the command carries it in its `timeout_ms` header): a
    /// consumer of your own that is not an agentsaga agent must do the same.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.def.timeout = Some(timeout);
        self
    }

    /// A bound on how long the command may wait to be picked up (schedule-to-start),
    /// off by default. If no agent has taken the command when it passes, the command is
    /// withdrawn and the step is treated like a timed-out one. Use it when "no agent
    /// took it within a minute" means something is wrong; the saga's
    /// [`deadline`](crate::SagaBuilder::deadline) bounds the whole saga.
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.def.start_timeout = Some(timeout);
        self
    }
}

/// Typestate: no pivot yet; steps must be undoable.
#[derive(Debug)]
pub enum BeforePivot {}
/// Typestate: past the pivot; steps cannot be undone.
#[derive(Debug)]
pub enum AfterPivot {}

/// Builds a [`SagaDefinition`]. See [`Saga::builder`].
#[must_use]
pub struct SagaBuilder<D, P = BeforePivot> {
    name: String,
    version: i32,
    stages: Vec<Vec<StepDef>>,
    deadline: Option<Duration>,
    input: InputCheck,
    _marker: PhantomData<fn(D, P)>,
}

/// Does a start's data decode as the saga's input type? Kept with a typed saga's
/// definition so that a start is refused before anything is written, not when its
/// first step is built (which a start that must wait for room does later).
#[derive(Clone)]
pub(crate) struct InputCheck(Arc<CheckFn>);

type CheckFn = dyn Fn(&Value) -> Result<()> + Send + Sync;

impl InputCheck {
    fn of<D: DeserializeOwned>() -> Self {
        Self(Arc::new(|v: &Value| data::<D>(v).map(drop)))
    }

    pub(crate) fn check(&self, data: &Value) -> Result<()> {
        (self.0)(data)
    }
}

impl std::fmt::Debug for InputCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InputCheck")
    }
}

/// The entry point for defining sagas over the data type `D`.
#[derive(Debug)]
pub struct Saga<D>(PhantomData<fn(D)>);

impl<D> Saga<D>
where
    D: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// A saga named `name` at definition `version`. Running instances finish on the
    /// version they started with, so register the old version beside a new one until
    /// they are done.
    pub fn builder(name: impl Into<String>, version: i32) -> SagaBuilder<D, BeforePivot> {
        SagaBuilder {
            name: name.into(),
            version,
            stages: Vec::new(),
            deadline: None,
            input: InputCheck::of::<D>(),
            _marker: PhantomData,
        }
    }
}

impl<D, P> SagaBuilder<D, P> {
    fn push(mut self, stage: Vec<StepDef>) -> Self {
        self.stages.push(stage);
        self
    }

    /// The whole saga's deadline: if it is still running forward then, it is aborted
    /// (compensated). Ignored once past the pivot.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The definition, ready to register.
    ///
    /// # Errors
    /// [`Error::InvalidDefinition`] for a saga without steps, an empty name, or two
    /// steps with the same name.
    pub fn build(self) -> Result<SagaDefinition> {
        if self.name.trim().is_empty() {
            return Err(Error::InvalidDefinition("the saga name is empty".into()));
        }
        let steps: Vec<&StepDef> = self.stages.iter().flatten().collect();
        if steps.is_empty() {
            return Err(Error::InvalidDefinition(format!(
                "saga `{}` has no steps",
                self.name
            )));
        }
        let mut names = std::collections::HashSet::new();
        for s in &steps {
            if !names.insert(s.name.as_str()) {
                return Err(Error::InvalidDefinition(format!(
                    "saga `{}` has two steps named `{}`",
                    self.name, s.name
                )));
            }
            if s.destination.trim().is_empty() {
                return Err(Error::InvalidDefinition(format!(
                    "step `{}` has no destination",
                    s.name
                )));
            }
        }
        Ok(SagaDefinition {
            name: self.name,
            version: self.version,
            stages: self.stages,
            deadline: self.deadline,
            planned: None,
            input: Some(self.input),
        })
    }
}

impl<D> SagaBuilder<D, BeforePivot> {
    /// The next step, undoable.
    pub fn step(self, step: Step<D, Undoable>) -> Self {
        self.push(vec![step.def])
    }

    /// Steps dispatched together and joined when all have replied; on failure the
    /// group's members are compensated together, before the steps that came earlier.
    pub fn parallel(self, steps: impl IntoIterator<Item = Step<D, Undoable>>) -> Self {
        self.push(steps.into_iter().map(|s| s.def).collect())
    }

    /// The point of no return: once it succeeds, the saga only goes forward.
    pub fn pivot(self, step: Step<D, Open>) -> SagaBuilder<D, AfterPivot> {
        let mut def = step.def;
        def.pivot = true;
        let this = self.push(vec![def]);
        SagaBuilder {
            name: this.name,
            version: this.version,
            stages: this.stages,
            deadline: this.deadline,
            input: this.input,
            _marker: PhantomData,
        }
    }
}

impl<D> SagaBuilder<D, AfterPivot> {
    /// The next step after the pivot: retried forward until it succeeds.
    pub fn step(self, step: Step<D, Open>) -> Self {
        self.push(vec![step.def])
    }

    /// Steps after the pivot dispatched together.
    pub fn parallel(self, steps: impl IntoIterator<Item = Step<D, Open>>) -> Self {
        self.push(steps.into_iter().map(|s| s.def).collect())
    }
}

/// A saga definition with its types erased: what the engine registers and runs.
#[derive(Clone, Debug)]
pub struct SagaDefinition {
    pub(crate) name: String,
    pub(crate) version: i32,
    pub(crate) stages: Vec<Vec<StepDef>>,
    pub(crate) deadline: Option<Duration>,
    /// A saga whose steps come from a plan, per instance (`stages` is empty then).
    pub(crate) planned: Option<Planned>,
    /// The check of a start's data against the typed saga's input (`None`: planned).
    pub(crate) input: Option<InputCheck>,
}

impl SagaDefinition {
    /// The saga's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its definition version.
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The destination its orchestrator consumes: replies, timers and notices.
    pub fn orchestrator_destination(&self) -> String {
        orchestrator_destination(&self.name, self.version)
    }

    /// Whether its steps come from a plan made at run time ([`PlannedSaga`]).
    pub fn is_planned(&self) -> bool {
        self.planned.is_some()
    }

    /// Checks `plan` as a start of this planned saga (or its planner's reply) would:
    /// the typed builder's rules and the destinations the saga allows. A planner agent
    /// may call it to refuse a plan itself, with the reason.
    ///
    /// # Errors
    /// [`Error::InvalidPlan`] saying what is wrong; [`Error::InvalidDefinition`] if
    /// this saga is not planned.
    pub fn check_plan(&self, plan: &crate::Plan) -> Result<()> {
        match &self.planned {
            Some(p) => p.catalog.validate(plan),
            None => Err(Error::InvalidDefinition(format!(
                "saga `{}` is not planned: its steps are fixed",
                self.name
            ))),
        }
    }

    /// Every agent destination its steps and compensations send to (for a planned
    /// saga: every destination its plans may use, and its planner's).
    pub fn agent_destinations(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        if let Some(p) = &self.planned {
            out.extend(p.catalog.destinations.iter().cloned());
        }
        let planner = self.planned.as_ref().and_then(|p| p.planner.as_ref());
        for s in self.stages.iter().flatten().chain(planner) {
            if s.wait.is_none() {
                out.push(s.destination.clone());
            }
            if let Some(destination) = s.undo.destination() {
                out.push(destination.to_owned());
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The signals its waits wait for, in step order (none for a planned saga: its
    /// waits are its plan's, per instance).
    pub fn waits(&self) -> Vec<&str> {
        self.stages
            .iter()
            .flatten()
            .filter_map(|s| s.wait.as_deref())
            .collect()
    }

    /// Its waits as they are registered when a saga starts: each signal's name, and
    /// whether it is a person's decision.
    pub(crate) fn declared_waits(&self) -> Vec<crate::engine::DeclaredWait> {
        self.stages
            .iter()
            .flatten()
            .filter_map(|s| {
                s.wait.as_ref().map(|name| crate::engine::DeclaredWait {
                    name: name.clone(),
                    approval: s.approval,
                })
            })
            .collect()
    }

    /// The steps in order, with their stage (parallel group) index.
    pub fn steps(&self) -> impl Iterator<Item = (usize, &StepDef)> {
        self.stages
            .iter()
            .enumerate()
            .flat_map(|(i, st)| st.iter().map(move |s| (i, s)))
    }

    /// The definition an instance with saga data `data` runs: this one, or for a
    /// planned saga, its planner step and the plan stored in `data`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a stored plan that does not decode.
    pub(crate) fn for_data(self: &Arc<Self>, data: &Value) -> Result<Arc<SagaDefinition>> {
        match &self.planned {
            None => Ok(Arc::clone(self)),
            Some(p) => Ok(Arc::new(SagaDefinition {
                stages: p.stages(data)?,
                ..SagaDefinition::clone(self)
            })),
        }
    }

    pub(crate) fn stage_range(&self, stage: usize) -> std::ops::Range<usize> {
        let start: usize = self.stages[..stage].iter().map(Vec::len).sum();
        start..start + self.stages[stage].len()
    }

    pub(crate) fn step(&self, idx: usize) -> Option<&StepDef> {
        self.stages.iter().flatten().nth(idx)
    }

    /// Whether step `idx` comes after the pivot.
    pub(crate) fn after_pivot(&self, idx: usize) -> bool {
        match self.stages.iter().flatten().position(|s| s.pivot) {
            Some(p) => idx > p,
            None => false,
        }
    }
}

/// The entry point for sagas whose steps are made at run time: a [`Plan`](crate::Plan) given at
/// start ([`PlanStart`](crate::PlanStart)), or returned by a planner step: see
/// [`plan`](crate::plan).
///
/// ```
/// use agentsaga_saga::{Plan, PlanStart, PlanStep, PlannedSaga};
/// use serde_json::json;
///
/// let def = PlannedSaga::builder("errand", 1)
///     .destinations(["search", "calendar", "mail"])
///     .build()
///     .unwrap();
/// let plan = Plan::new()
///     .then(PlanStep::command("find", "search", json!({ "q": { "$from": "/input/topic" } }))
///         .nothing_to_undo())
///     .then(PlanStep::command("book", "calendar", json!({ "about": { "$from": "/results/find" } }))
///         .compensate("calendar", json!({ "cancel": { "$from": "/results/book/event_id" } })))
///     .then(PlanStep::command("send", "mail", json!("done")).pivot());
/// let start = PlanStart::new(plan, json!({ "topic": "sagas" })).unwrap();
/// // runtime.start_saga("errand", &start).await? — checked against the rules and the
/// // destinations when it starts.
/// # let _ = (def, start);
/// ```
#[derive(Debug)]
pub struct PlannedSaga;

impl PlannedSaga {
    /// A planned saga named `name` at definition `version`.
    pub fn builder(name: impl Into<String>, version: i32) -> PlannedBuilder {
        PlannedBuilder {
            name: name.into(),
            version,
            destinations: std::collections::BTreeSet::new(),
            approvals: std::collections::BTreeSet::new(),
            planner: None,
            deadline: None,
            retry: RetryPolicy::default(),
            timeout: None,
        }
    }
}

/// Builds a planned [`SagaDefinition`]. See [`PlannedSaga::builder`].
#[must_use]
pub struct PlannedBuilder {
    name: String,
    version: i32,
    destinations: std::collections::BTreeSet<String>,
    approvals: std::collections::BTreeSet<String>,
    planner: Option<StepDef>,
    deadline: Option<Duration>,
    retry: RetryPolicy,
    timeout: Option<Duration>,
}

impl PlannedBuilder {
    /// How the plan's steps retry retryable failures (default: 1 s doubling to 60 s,
    /// 10 attempts); a step's `max_attempts` overrides the attempts. Steps after the
    /// pivot retry without a budget.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The timeout of a plan step that sets no `timeout_ms`, as [`Step::timeout`]
    /// (default: none).
    pub fn step_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The destinations its plans may send commands and compensations to: a plan
    /// naming any other is refused.
    pub fn destinations<S: Into<String>>(
        mut self,
        destinations: impl IntoIterator<Item = S>,
    ) -> Self {
        self.destinations
            .extend(destinations.into_iter().map(Into::into));
        self
    }

    /// Signals that are a person's decision in every plan of this saga: a plan's wait
    /// for one of them is an approval ([`Step::approval`]) whether the plan says so
    /// (`"approval": true`) or not. A plan written by an LLM cannot then make a
    /// person's decision one that an LLM-facing surface may send.
    pub fn approvals<S: Into<String>>(mut self, signals: impl IntoIterator<Item = S>) -> Self {
        self.approvals.extend(signals.into_iter().map(Into::into));
        self
    }

    /// A first step whose reply is the plan: a [`Plan`](crate::Plan) as JSON, or a
    /// planner's text answer (prose, fenced JSON: see
    /// [`Plan::from_text`](crate::Plan::from_text)). The reply is checked like
    /// a plan given at start; one that fails fails the step, fatally, with the reason
    /// (the saga then compensates what came before, which is nothing but the planner
    /// step itself). Its `on_reply` is replaced by storing the plan; its command is
    /// built from the saga data (`{"input": …, "results": {}}`). Starts of this saga
    /// pass the input alone.
    pub fn planner(mut self, step: Step<Value, Undoable>) -> Self {
        self.planner = Some(step.def);
        self
    }

    /// The whole saga's deadline, as [`SagaBuilder::deadline`].
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The definition, ready to register.
    ///
    /// # Errors
    /// [`Error::InvalidDefinition`] for an empty name or no destinations.
    pub fn build(self) -> Result<SagaDefinition> {
        if self.name.trim().is_empty() {
            return Err(Error::InvalidDefinition("the saga name is empty".into()));
        }
        if self.destinations.is_empty() || self.destinations.iter().any(|d| d.trim().is_empty()) {
            return Err(Error::InvalidDefinition(format!(
                "planned saga `{}` names no destinations its plans may use",
                self.name
            )));
        }
        let catalog = Arc::new(Catalog {
            destinations: self.destinations,
            approvals: self.approvals,
            planner_name: self.planner.as_ref().map(|p| p.name.clone()),
            retry: self.retry,
            timeout: self.timeout,
        });
        let planner = self.planner.map(|mut p| {
            let catalog = Arc::clone(&catalog);
            p.fold = Some(Arc::new(move |data: &mut Value, reply: Value| {
                catalog.fold_plan(data, reply)
            }));
            p
        });
        Ok(SagaDefinition {
            name: self.name,
            version: self.version,
            stages: Vec::new(),
            deadline: self.deadline,
            planned: Some(Planned { catalog, planner }),
            input: None,
        })
    }
}

/// The orchestrator destination of saga `name` at `version`: `saga.<name>.v<version>`.
/// One per version, so that only processes that have the version consume its replies.
pub fn orchestrator_destination(name: &str, version: i32) -> String {
    format!("saga.{name}.v{version}")
}
