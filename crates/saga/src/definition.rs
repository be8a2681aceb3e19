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

mod builder;
mod destinations;
mod planned;
pub(crate) mod sleep;
pub(crate) mod step;
mod wait;
pub(crate) mod wake;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::plan::Planned;
use crate::{Error, Result};
pub(crate) use builder::InputCheck;
pub use builder::{AfterPivot, BeforePivot, Saga, SagaBuilder};
pub(crate) use destinations::child_of;
pub use destinations::{child_destination, orchestrator_destination};
pub use planned::{PlannedBuilder, PlannedSaga};
pub(crate) use step::DeclaredWait;
pub use step::{Open, Step, StepDef, Undoable};

/// A saga definition with its types erased: what the engine registers and runs.
#[derive(Clone, Debug)]
pub struct SagaDefinition {
    pub(crate) name: String,
    pub(crate) version: i32,
    pub(crate) stages: Vec<Vec<StepDef>>,
    pub(crate) deadline: Option<Duration>,
    /// What each instance may spend, and what it does once that is spent.
    pub(crate) budget: Option<(crate::Budget, crate::OnBudgetSpent)>,
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
    /// the typed builder's rules, the destinations the saga allows and its guardrails
    /// ([`PlannedBuilder::max_steps`](crate::PlannedBuilder::max_steps); a plan that
    /// would pre-empt [`approve_before`](crate::PlannedBuilder::approve_before)'s
    /// waits). A planner agent may call it to refuse a plan itself, with the reason.
    ///
    /// # Errors
    /// [`Error::InvalidPlan`] saying what is wrong; [`Error::InvalidDefinition`] if
    /// this saga is not planned.
    pub fn check_plan(&self, plan: &crate::Plan) -> Result<()> {
        match &self.planned {
            Some(p) => p.catalog.accept(plan.clone()).map(drop),
            None => Err(Error::InvalidDefinition(format!(
                "saga `{}` is not planned: its steps are fixed",
                self.name
            ))),
        }
    }

    /// Checks `more`, the stages a planner's later turn (`PlannedBuilder::replan`)
    /// would add to the plan `so_far` (as the saga data holds it at `/plan`), as the
    /// engine will: with every turn before it, as one plan. A planner agent may call it
    /// to refuse its own answer, with the reason.
    ///
    /// # Errors
    /// As [`check_plan`](Self::check_plan).
    pub fn check_turn(&self, so_far: &crate::Plan, more: &crate::Plan) -> Result<()> {
        match &self.planned {
            Some(p) => p.catalog.extend(so_far.clone(), more.clone()).map(drop),
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
            if s.child.is_some() {
                continue; // a child saga's orchestrators, not an agent
            }
            // A wait or a sleep sends nothing to an agent.
            if s.wait.is_none() && s.wake.is_none() {
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
    pub(crate) fn declared_waits(&self) -> Vec<DeclaredWait> {
        self.stages
            .iter()
            .flatten()
            // An inserted approval wait registers its signal when it is dispatched.
            .filter(|s| s.approves.is_none())
            .filter_map(|s| {
                s.wait.as_ref().map(|name| DeclaredWait {
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

    /// The indices of the steps of stage `stage` (empty past the last stage: a planned
    /// saga's definition may have lost a planner turn it was at, e.g. registered again
    /// with fewer `replan` turns).
    pub(crate) fn stage_range(&self, stage: usize) -> std::ops::Range<usize> {
        let start: usize = self.stages.iter().take(stage).map(Vec::len).sum();
        start..start + self.stages.get(stage).map_or(0, Vec::len)
    }

    pub(crate) fn step(&self, idx: usize) -> Option<&StepDef> {
        self.stages.iter().flatten().nth(idx)
    }

    /// Does it have a pivot (a step after which it cannot be undone)?
    pub fn has_pivot(&self) -> bool {
        self.stages.iter().flatten().any(|s| s.pivot)
    }

    /// The index of its pivot step in an instance whose saga data is `data` (a
    /// planned saga's steps are in its data): `None` without a pivot.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a stored plan that does not decode.
    pub fn pivot_for(&self, data: &Value) -> Result<Option<usize>> {
        let planned;
        let stages = match &self.planned {
            None => &self.stages,
            Some(p) => {
                planned = p.stages(data)?;
                &planned
            }
        };
        Ok(stages.iter().flatten().position(|s| s.pivot))
    }

    /// Whether step `idx` comes after the pivot.
    pub(crate) fn after_pivot(&self, idx: usize) -> bool {
        match self.stages.iter().flatten().position(|s| s.pivot) {
            Some(p) => idx > p,
            None => false,
        }
    }
}
