//! A step as the builder writes it (`Step`, typed, with its typestate: open or
//! undoable) and as the engine runs it (`StepDef`, its types erased), and what a step
//! declares (its compensation, its wait).

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::RetryPolicy;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::Result;

pub(crate) type BuildFn = Arc<dyn Fn(&Value) -> Result<Value> + Send + Sync>;
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
    pub(crate) def: StepDef,
    pub(super) _marker: PhantomData<fn(D, U)>,
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
    /// The undo of a step that runs saga `child` as a child: a compensation sent to
    /// the child's destination, which undoes the child as a whole.
    pub(crate) fn child(child: &str) -> Self {
        Undo::Command {
            destination: crate::child_destination(child),
            build: Arc::new(|_: &Value| Ok(Value::Null)),
        }
    }

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
    /// The saga this step runs as a child (`Step::saga`), by name.
    pub(crate) child: Option<String>,
    /// An approval wait the engine inserted before the command of this step (of a
    /// plan: `PlannedBuilder::approve_before`): its command is the record of what the
    /// person approves, written to `/results/<wait>` when it is dispatched, and its
    /// signal is registered then (not at start: no approval before the command is
    /// there to see).
    pub(crate) approves: Option<String>,
    /// When the step wakes by time: a sleep (`Step::sleep`, no signal), or a wait
    /// that ends when its signal has not come in time (`Step::or_after`).
    pub(crate) wake: Option<super::wake::Wake>,
}

impl StepDef {
    /// A command step named `name` to `destination` with every default: its command
    /// the whole saga data, no fold, never undone, the default retries, no timeouts.
    /// Each kind of step (a wait, a sleep, a plan's step) changes what it needs.
    pub(crate) fn new(name: String, destination: String) -> Self {
        Self {
            name,
            destination,
            command: Arc::new(|v: &Value| Ok(v.clone())),
            fold: None,
            undo: Undo::Never,
            retry: RetryPolicy::default(),
            timeout: None,
            start_timeout: None,
            pivot: false,
            wait: None,
            approval: false,
            child: None,
            approves: None,
            wake: None,
        }
    }

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

    /// The saga it runs as a child ([`Step::saga`]), if it is one.
    pub fn child_saga(&self) -> Option<&str> {
        self.child.as_deref()
    }

    /// Whether it is a sleep ([`Step::sleep`], [`Step::sleep_until`]): a wait that
    /// only time ends.
    pub fn is_sleep(&self) -> bool {
        self.wake.is_some() && self.wait.is_none()
    }
}

impl std::fmt::Debug for StepDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepDef")
            .field("name", &self.name)
            .field("destination", &self.destination)
            .field("pivot", &self.pivot)
            .field("timeout", &self.timeout)
            .field("wake", &self.wake)
            .finish_non_exhaustive()
    }
}

pub(crate) fn data<D: DeserializeOwned>(v: &Value) -> Result<D> {
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
            def: StepDef::new(name.into(), destination.into()),
            _marker: PhantomData,
        }
    }

    /// A step that runs the saga `child` (registered in the same engine) as a child:
    /// its command, the whole saga data unless set with [`command`](Self::command), is
    /// the child's input; its reply, for [`on_reply`](Self::on_reply), is the child's
    /// data once the child completed. A child that is compensated or aborted fails the
    /// step (fatal: the parent turns back); a stuck child keeps the step waiting until
    /// an operator acts on the child.
    ///
    /// The child is started once, whatever is sent again or by whom, by any process
    /// that hosts its definition. Undo is compensating the child as a whole: when the
    /// parent turns back, a child that completed has its completed steps undone in
    /// reverse, and a running one is aborted. So a child whose definition has a pivot
    /// cannot be undone once past it: make it the pivot or a step after it
    /// ([`forward_only`](Step::forward_only)), or [`Engine::new`](crate::Engine::new)
    /// refuses the parent.
    ///
    /// ```
    /// # use agentsaga_saga::{Saga, Step, Engine};
    /// # use serde::{Deserialize, Serialize};
    /// # #[derive(Serialize, Deserialize)] struct Trip { city: String }
    /// # #[derive(Serialize, Deserialize)] struct Travel { trip: Trip }
    /// let trip = Saga::<Trip>::builder("trip_booking", 1)
    ///     .step(Step::new("hotel", "hotels").compensate("hotels", |_: &Trip| "cancel"))
    ///     .build()
    ///     .unwrap();
    /// let travel = Saga::<Travel>::builder("business_travel", 1)
    ///     .step(
    ///         Step::saga("book", "trip_booking")
    ///             .command(|t: &Travel| serde_json::json!({ "city": t.trip.city })),
    ///     )
    ///     .build()
    ///     .unwrap();
    /// let engine = Engine::new([trip, travel]).unwrap();
    /// ```
    pub fn saga(name: impl Into<String>, child: impl Into<String>) -> Step<D, Undoable> {
        let child = child.into();
        let mut step = Step::<D, Open>::new(name, crate::child_destination(&child));
        step.def.undo = Undo::child(&child);
        step.def.child = Some(child);
        Step {
            def: step.def,
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

/// A wait a saga declares: the signal's name, and whether it is a person's decision
/// (`Step::approval`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeclaredWait {
    pub(crate) name: String,
    pub(crate) approval: bool,
}

impl<D> Step<D, Undoable>
where
    D: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// This step without its undo: for a [`Step::saga`] whose child has a pivot, as
    /// the parent's pivot or a step after it (a child past its pivot cannot be undone).
    pub fn forward_only(mut self) -> Step<D, Open> {
        self.def.undo = Undo::Never;
        Step {
            def: self.def,
            _marker: PhantomData,
        }
    }
}
