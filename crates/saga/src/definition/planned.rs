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
            agent_signals: std::collections::BTreeSet::new(),
            sagas: std::collections::BTreeMap::new(),
            planner: None,
            deadline: None,
            budget: None,
            retry: RetryPolicy::default(),
            timeout: None,
            max_steps: None,
            approve_before: std::collections::BTreeSet::new(),
            max_turns: 1,
            replan_on_failure: false,
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
    agent_signals: std::collections::BTreeSet<String>,
    sagas: std::collections::BTreeMap<String, bool>,
    planner: Option<StepDef>,
    deadline: Option<Duration>,
    budget: Option<(crate::Budget, crate::OnBudgetSpent)>,
    retry: RetryPolicy,
    timeout: Option<Duration>,
    max_steps: Option<usize>,
    approve_before: std::collections::BTreeSet<String>,
    max_turns: u32,
    replan_on_failure: bool,
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

    /// Signals that are a person's decision in every plan of this saga. Every wait of
    /// a plan is one already unless [`agent_signals`](Self::agent_signals) names its
    /// signal; naming it here as well keeps it a person's decision.
    pub fn approvals<S: Into<String>>(mut self, signals: impl IntoIterator<Item = S>) -> Self {
        self.approvals.extend(signals.into_iter().map(Into::into));
        self
    }

    /// Signals that an agent (an LLM-facing surface included) may send to this saga's
    /// plans' waits: outside events, never a person's decision. A wait for any other
    /// signal is a person's decision ([`Step::wait_for`]), however the plan writes it:
    /// a plan (an LLM's) can mark a wait `"approval": true`, never lower one.
    pub fn agent_signals<S: Into<String>>(mut self, signals: impl IntoIterator<Item = S>) -> Self {
        self.agent_signals
            .extend(signals.into_iter().map(Into::into));
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

    /// The most steps a plan of this saga may have: every step of every stage, waits,
    /// parallel members and child-saga stages included (the approval waits the engine
    /// inserts for [`approve_before`](Self::approve_before) are not counted: the plan
    /// as written is). A plan with more, given at start or returned by the planner, is
    /// refused like any invalid plan, [`Error::InvalidPlan`] (a planner's reply fails
    /// the planner step, fatally), with the reason `the plan has 12 steps; this saga
    /// allows at most 10 (PlannedBuilder::max_steps)`. Never above
    /// [`MAX_PLAN_STEPS`](crate::plan::MAX_PLAN_STEPS), which holds for every plan.
    pub fn max_steps(mut self, n: usize) -> Self {
        self.max_steps = Some(n);
        self
    }

    /// Destinations (of [`destinations`](Self::destinations)) whose commands need a
    /// person's approval. Whatever a plan says (given at start or by the planner),
    /// before each of its command steps to one of them the engine runs an approval
    /// wait ([`Step::approval`]: its signal is taken only from a person, never from an
    /// agent's tools) named `approve.<step>` and waiting for the signal
    /// `approve.<step>`; for a parallel group, one such wait per member to such a
    /// destination, together in a stage just before the group. The plan as stored (at
    /// `/plan` in the saga data) has them, each marked `"approves": "<step>"`.
    ///
    /// When the saga reaches the wait, the command the step will send (its `$from`
    /// references resolved) is recorded at `/results/approve.<step>` as
    /// `{"step", "destination", "command"}`, where `agentsaga sagas show` and the
    /// console show it; only then can the signal be sent (before, it is refused: the
    /// saga does not wait for it yet). Approved, the payload joins the record as
    /// `approved` and the step sends exactly the recorded command; rejected or timed
    /// out (the wait's timeout is [`step_timeout`](Self::step_timeout)'s), the wait
    /// fails as any wait does: before the pivot the saga compensates, at or after it
    /// it is stuck for an operator. Compensations to these destinations are not held
    /// (undoing is not a new decision), nor are child-saga stages.
    ///
    /// A plan cannot get around it: one that names a step or a signal starting
    /// `approve.` is refused (`step `approve.book`: names starting `approve.` are the
    /// approval waits this saga inserts …`), and so is one that sets `approves`
    /// itself. A step whose wait's name would be over
    /// [`MAX_PLAN_NAME_BYTES`](crate::plan::MAX_PLAN_NAME_BYTES) is refused too.
    pub fn approve_before<S: Into<String>>(
        mut self,
        destinations: impl IntoIterator<Item = S>,
    ) -> Self {
        self.approve_before
            .extend(destinations.into_iter().map(Into::into));
        self
    }

    /// Lets the [`planner`](Self::planner) extend its plan as it goes, in up to
    /// `max_turns` turns (the first, which makes the plan, included; 1, the default:
    /// the plan is made once). Once the stages a turn added have run, the planner is
    /// asked again (its step of turn `n` is named `<planner>_<n>`, e.g. `plan_2`),
    /// its command built from the saga data as it stands: `results` so far, the
    /// `plan` so far, `turns` (the stages each turn added). It answers with the
    /// next stages, as a plan, or `{"done": true}`; past `max_turns` it is not asked,
    /// and the saga completes once the last turn's stages have run.
    ///
    /// Stages that ran never change. What a turn adds is checked with everything
    /// before it, as one plan: names unique across turns (a plan step may not take a
    /// turn's name), `$from` references to any earlier step, one pivot and nothing
    /// undoable after it, [`max_steps`](Self::max_steps) counting every turn's steps,
    /// [`approve_before`](Self::approve_before) waits inserted. A turn that breaks a
    /// rule fails, fatally, with the reason: the saga compensates the steps of every
    /// turn, latest first. Each turn is a step like any other (its own idempotency
    /// key, timeout, retries, recorded answer), so a restart never asks twice for the
    /// same turn.
    pub fn replan(mut self, max_turns: u32) -> Self {
        self.max_turns = max_turns;
        self.replan_on_failure = false;
        self
    }

    /// As [`replan`](Self::replan), but the planner is asked again only when a step
    /// fails: once its first turn's stages all succeed, the saga completes. When a
    /// step before the pivot fails (its agent answered a failure, or its retries ran
    /// out), the rest of that turn's stages are dropped (they never ran), the failure
    /// is recorded at `/failed` (`[{"step", "error"}]`, every failed member of the
    /// stage once its siblings have answered) and the planner is asked for the next
    /// stages, with the results so far. It answers with other stages (the failure
    /// moves to `/failures`; the failed step keeps its name, so a step added instead
    /// needs a new one), or `{"done": true}` (the saga completes, the failed step
    /// staying failed); to give up, its call fails and the saga compensates every
    /// turn's steps. A lost step (timed out, dead-lettered) compensates as before, and
    /// so does a failure once no turn is left.
    pub fn replan_on_failure(mut self, max_turns: u32) -> Self {
        self.max_turns = max_turns;
        self.replan_on_failure = true;
        self
    }

    /// What each instance may spend, as [`SagaBuilder::budget`](super::SagaBuilder::budget):
    /// the planner's turns count, as every step does.
    pub fn budget(mut self, budget: crate::Budget, on_spent: crate::OnBudgetSpent) -> Self {
        self.budget = Some((budget, on_spent));
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
    /// [`Error::InvalidDefinition`] for an empty name or no destinations, a
    /// [`max_steps`](Self::max_steps) of 0, a [`replan`](Self::replan) of 0 or
    /// without a planner, or an
    /// [`approve_before`](Self::approve_before) destination not among its
    /// [`destinations`](Self::destinations).
    pub fn build(self) -> Result<SagaDefinition> {
        if self.name.trim().is_empty() {
            return Err(Error::InvalidDefinition("the saga name is empty".into()));
        }
        if self.max_turns == 0 || (self.max_turns > 1 && self.planner.is_none()) {
            return Err(Error::InvalidDefinition(format!(
                "planned saga `{}`: replan({}) needs a planner step and at least 1 turn",
                self.name, self.max_turns
            )));
        }
        if self.max_steps == Some(0) {
            return Err(Error::InvalidDefinition(format!(
                "planned saga `{}`: max_steps(0) allows no plan at all",
                self.name
            )));
        }
        if let Some(d) = self
            .approve_before
            .iter()
            .find(|d| !self.destinations.contains(*d))
        {
            return Err(Error::InvalidDefinition(format!(
                "planned saga `{}`: approve_before names `{d}`, which is not among its \
                 destinations",
                self.name
            )));
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
            agent_signals: self.agent_signals,
            sagas: self.sagas,
            planner_name: self.planner.as_ref().map(|p| p.name.clone()),
            retry: self.retry,
            timeout: self.timeout,
            max_steps: self.max_steps,
            approve_before: self.approve_before,
            max_turns: self.max_turns,
            replan_on_failure: self.replan_on_failure,
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
            budget: self.budget,
            planned: Some(Planned { catalog, planner }),
            input: None,
        })
    }
}
