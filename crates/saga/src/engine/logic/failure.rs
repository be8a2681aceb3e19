//! Failure: what a failed step, a step whose outcome is unknown (timed out, not
//! started in time, dead-lettered), a passed deadline, or a message the orchestrator
//! could not process means for the saga. Before the pivot it compensates; at or after
//! it a lost command is sent again, and a failed step leaves the saga stuck.

use agentsaga_core::MessageId;

use super::Ctx;
use crate::protocol::StepOutcome;
use crate::{Error, Result, SagaEvent, SagaState, StepState};

impl Ctx<'_> {
    /// Step `idx`'s `message` (its command or compensation) has an unknown outcome (it
    /// timed out, or was withdrawn unstarted) or was never processed (dead-lettered).
    pub(super) fn on_lost(&mut self, idx: usize, message: MessageId, why: String) -> Result<()> {
        let Some(row) = self.inst.steps.get(&idx) else {
            return self.ignore(format!("notice for step {idx}, never dispatched"));
        };
        if row.compensation_message_id == Some(message) {
            return self.on_compensation_reply(idx, StepOutcome::Retryable(why));
        }
        if row.command_id != Some(message) || row.state != StepState::Dispatched {
            return self.ignore(format!("stale notice for step {idx}: {why}"));
        }
        if self.inst.state != SagaState::Running {
            return self.ignore(format!("notice for step {idx} while {}", self.inst.state));
        }
        let def = self.def()?;
        let sd = def
            .step(idx)
            .ok_or_else(|| Error::Corrupt(format!("no step {idx}")))?;
        // A wait that timed out is not waited for again: at or after the pivot the
        // saga is stuck for an operator, as for a failed step.
        let (forward_only, policy, attempts) = (
            (sd.pivot || def.after_pivot(idx)) && sd.wait.is_none(),
            sd.retry,
            row.attempts,
        );
        if forward_only {
            // Forward only: the command goes again (the agent must be idempotent on the
            // saga id — its inbox sees a new message id).
            let delay = policy.backoff_with(attempts, &mut self.rng);
            let row = self.inst.steps.get_mut(&idx).expect("checked");
            row.error = Some(why);
            if !self.budget_allows(super::budget::Dispatch::Again(idx))? {
                return Ok(());
            }
            return self.dispatch_step(idx, delay);
        }
        self.cancel_timer(idx);
        self.fail_step(idx, why)
    }

    /// The saga's deadline passed: a saga still before its pivot is aborted.
    pub(super) fn on_deadline(&mut self) -> Result<()> {
        // A rewind's undos run: it is given up, and the saga undoes everything.
        if self.abandon_rewind("the saga's deadline passed") {
            return Ok(());
        }
        if self.inst.state != SagaState::Running || self.past_pivot() {
            return self.ignore("saga deadline after the pivot or when not running");
        }
        self.begin_compensation(SagaEvent::Abort, "the saga's deadline passed".into())
    }

    /// A message about step `idx` (if known) could not be processed: the step fails
    /// with `why`, or, when no step is at fault, the saga does.
    pub(crate) fn fail_processing(&mut self, idx: Option<usize>, why: String) -> Result<()> {
        match self.inst.state {
            SagaState::Running => {
                let dispatched = idx.filter(|i| {
                    self.inst.steps.get(i).map(|r| r.state) == Some(StepState::Dispatched)
                });
                if let Some(idx) = dispatched {
                    let def = self.def()?;
                    let forward_only =
                        def.after_pivot(idx) || def.step(idx).is_some_and(|s| s.pivot);
                    let row = self.inst.steps.get_mut(&idx).expect("dispatched");
                    let timer = row.timer_id.take();
                    self.fx.cancel.extend(timer);
                    if !forward_only {
                        return self.fail_step(idx, why);
                    }
                    // The pivot (or a step after it) may well have succeeded: the saga
                    // cannot be undone, only an operator can take it on.
                    row.state = StepState::Failed;
                    row.error = Some(why.clone());
                    self.inst.error = Some(format!("step `{}`: {why}", row.name));
                    return self.transition(SagaEvent::StepFailedAfterPivot);
                }
                if self.past_pivot() {
                    self.inst.error = Some(why);
                    self.transition(SagaEvent::StepFailedAfterPivot)
                } else {
                    self.begin_compensation(SagaEvent::StepFailed, why)
                }
            }
            SagaState::Compensating => {
                self.inst.error = Some(why);
                self.transition(SagaEvent::CompensationExhausted)
            }
            state => self.ignore(format!("cannot process a message while {state}: {why}")),
        }
    }

    /// Step `idx` failed for good: compensate before the pivot, stuck after it.
    pub(super) fn fail_step(&mut self, idx: usize, error: String) -> Result<()> {
        let after_pivot = self.def()?.after_pivot(idx);
        let row = self.inst.steps.get_mut(&idx).expect("dispatched");
        row.state = StepState::Failed;
        row.error = Some(error.clone());
        let name = row.name.clone();
        let error = format!("step `{name}` failed: {error}");
        if after_pivot {
            self.inst.error = Some(error);
            self.transition(SagaEvent::StepFailedAfterPivot)
        } else {
            self.begin_compensation(SagaEvent::StepFailed, error)
        }
    }
}
