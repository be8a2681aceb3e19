//! Operators: abort a running saga (or give up on one stuck after its pivot), retry a
//! stuck one, skip a stuck compensation. An action the saga's state does not allow is
//! refused with [`Error::WrongState`], saying why.

use std::time::Duration;

use super::Ctx;
use crate::{CompensationState, Error, Result, SagaEvent, SagaState, StepState};

impl Ctx<'_> {
    /// Abort: compensate a running saga still before its pivot, or end one stuck
    /// after it (`aborted`, nothing undone).
    pub(crate) fn abort(&mut self) -> Result<()> {
        let state = self.inst.state;
        // An abort ends a pause: the saga turns back (or gives up) now. (A refused
        // abort changes nothing: its caller writes nothing.)
        self.inst.pause = None;
        match state {
            SagaState::Running if self.past_pivot() => {
                Err(self.wrong("abort", ", past its pivot: it can only go forward".into()))
            }
            SagaState::Running => {
                self.begin_compensation(SagaEvent::Abort, "aborted by an operator".into())
            }
            SagaState::Stuck if self.inst.failed_compensation().is_none() => {
                self.inst.error = Some(format!(
                    "{} (aborted by an operator)",
                    self.inst.error.clone().unwrap_or_default()
                ));
                self.transition(SagaEvent::Abort)
            }
            SagaState::Stuck => {
                Err(self.wrong("abort", ": a compensation failed; use retry or skip".into()))
            }
            _ => Err(self.wrong("abort", String::new())),
        }
    }

    /// Retry a stuck saga: its failed compensation (from the ledger), or its failed
    /// steps after the pivot (which needs the definition).
    pub(crate) fn retry(&mut self) -> Result<()> {
        if self.paused() {
            return Err(self.wrong("retry", ": it is paused (resume it first)".into()));
        }
        if self.inst.state != SagaState::Stuck {
            return Err(self.wrong("retry", ": only stuck sagas are retried".into()));
        }
        if let Some(idx) = self.inst.failed_compensation() {
            let row = self.inst.steps.get_mut(&idx).expect("found");
            row.compensation_state = Some(CompensationState::Recorded);
            row.compensation_attempts = 0;
            self.transition(SagaEvent::Retry)?;
            return self.advance_compensation();
        }
        if self.def.is_none() {
            return Err(self.wrong(
                "retry",
                ", and its definition is not registered here".into(),
            ));
        }
        // The failed steps of the stage it is stuck at (a failed step of an earlier
        // stage was answered by its planner: `replan_on_failure`).
        let stage = self.inst.stage;
        let failed: Vec<usize> = self
            .inst
            .steps
            .values()
            .filter(|r| r.state == StepState::Failed && r.stage == stage)
            .map(|r| r.idx)
            .collect();
        self.transition(SagaEvent::RetryForward)?;
        self.inst.error = None;
        for idx in failed {
            self.dispatch_step(idx, Duration::ZERO)?;
        }
        // What a spent budget held back goes too, if the budget now allows it.
        if self
            .inst
            .budget
            .as_ref()
            .is_some_and(|b| !b.held.is_empty())
        {
            self.release_held()?;
        }
        Ok(())
    }

    /// Skip a stuck compensation: recorded as done by hand, and the saga goes on
    /// compensating.
    pub(crate) fn skip(&mut self) -> Result<()> {
        if self.paused() {
            return Err(self.wrong("skip", ": it is paused (resume it first)".into()));
        }
        let Some(idx) = self
            .inst
            .failed_compensation()
            .filter(|_| self.inst.state == SagaState::Stuck)
        else {
            return Err(self.wrong("skip", ": skip applies to a stuck compensation".into()));
        };
        let now = self.now_ms;
        let row = self.inst.steps.get_mut(&idx).expect("found");
        row.compensation_state = Some(CompensationState::Skipped);
        row.compensated_at = Some(now);
        row.compensation_error = Some(format!(
            "{} (skipped by an operator)",
            row.compensation_error.clone().unwrap_or_default()
        ));
        self.transition(SagaEvent::Skip)?;
        self.advance_compensation()
    }

    pub(super) fn wrong(&self, action: &'static str, why: String) -> Error {
        Error::WrongState {
            id: self.inst.id,
            action,
            state: self.inst.state,
            why,
        }
    }
}
