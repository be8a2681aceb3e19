//! The typed saga builder: `Saga::<D>::builder`, its steps before and after the pivot
//! (a typestate), and the check of a start's data against `D`.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::SagaDefinition;
use super::step::{Open, Step, StepDef, Undoable, data};
use crate::{Error, Result};

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
    budget: Option<(crate::Budget, crate::OnBudgetSpent)>,
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
            budget: None,
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

    /// What each instance may spend ([`Usage`](crate::Usage) its agents report), and
    /// what it does once that is spent: it dispatches no further forward step, then
    /// compensates or waits for an operator to raise the budget
    /// ([`Engine::raise_budget`](crate::Engine::raise_budget)).
    pub fn budget(mut self, budget: crate::Budget, on_spent: crate::OnBudgetSpent) -> Self {
        self.budget = Some((budget, on_spent));
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
            budget: self.budget,
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
            budget: this.budget,
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
