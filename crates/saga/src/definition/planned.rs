//! Sagas whose steps are made at run time: `PlannedSaga::builder`, its allowed
//! destinations, approvals and planner step.

use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::RetryPolicy;
use serde_json::Value;

use super::SagaDefinition;
use super::step::{Step, StepDef, Undoable};
use crate::plan::{Catalog, Planned};
use crate::{Error, Result};

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
            sagas: std::collections::BTreeMap::new(),
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
    sagas: std::collections::BTreeMap<String, bool>,
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

    /// The sagas its plans may run as child sagas (a stage `{"saga": "<name>", "input":
    /// …}`, as [`Step::saga`](crate::Step::saga)): a plan naming any other is refused.
    /// Each must be registered in the same engine, as given here. A child whose
    /// definition has a pivot can only be the plan's pivot or a step after it (it cannot
    /// be undone once past its pivot); one without is undone by compensating it. A
    /// planned child's plan may still have a pivot: undoing it once past that pivot
    /// fails (the parent is stuck, for an operator) rather than undo half of it.
    pub fn child_sagas<'a>(mut self, sagas: impl IntoIterator<Item = &'a SagaDefinition>) -> Self {
        self.sagas
            .extend(sagas.into_iter().map(|d| (d.name.clone(), d.has_pivot())));
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

    /// The whole saga's deadline, as [`SagaBuilder::deadline`](super::SagaBuilder::deadline).
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
        if (self.destinations.is_empty() && self.sagas.is_empty())
            || self.destinations.iter().any(|d| d.trim().is_empty())
        {
            return Err(Error::InvalidDefinition(format!(
                "planned saga `{}` names no destinations its plans may use",
                self.name
            )));
        }
        let catalog = Arc::new(Catalog {
            destinations: self.destinations,
            approvals: self.approvals,
            sagas: self.sagas,
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
