//! Compensation: the steps taken are undone from the ledger, the latest stage first
//! (a stage's compensations together), each retried per the compensation policy; when
//! one exhausts it the saga is stuck.

use std::time::Duration;

use super::Ctx;
use crate::engine::model::StepRow;
use crate::protocol::StepOutcome;
use crate::{CompensationState, Error, Result, SagaEvent, SagaState};

impl Ctx<'_> {
    /// Leaves the forward path on `event` (a failed step, an abort): timers of the
    /// steps in flight are moot, and the latest stage's compensations go out.
    pub(super) fn begin_compensation(&mut self, event: SagaEvent, error: String) -> Result<()> {
        self.inst.error = Some(error);
        self.transition(event)?;
        let timers: Vec<_> = self
            .inst
            .steps
            .values_mut()
            .filter_map(|r| r.timer_id.take())
            .collect();
        self.fx.cancel.extend(timers);
        self.advance_compensation()
    }

    /// Sends the compensations of the latest stage that still has any to run, once
    /// every later one is done; `compensated` when none are left.
    pub(super) fn advance_compensation(&mut self) -> Result<()> {
        let open = |r: &StepRow| {
            matches!(
                r.compensation_state,
                Some(
                    CompensationState::Recorded
                        | CompensationState::Dispatched
                        | CompensationState::Failed
                )
            )
        };
        let Some(stage) = self
            .inst
            .steps
            .values()
            .filter(|r| open(r))
            .map(|r| r.stage)
            .max()
        else {
            return self.transition(SagaEvent::AllCompensated);
        };
        let idxs: Vec<usize> = self
            .inst
            .steps
            .values()
            .filter(|r| {
                r.stage == stage && r.compensation_state == Some(CompensationState::Recorded)
            })
            .map(|r| r.idx)
            .collect();
        for idx in idxs {
            self.dispatch_compensation(idx, Duration::ZERO)?;
        }
        Ok(())
    }

    /// Sends step `idx`'s compensation, as the ledger recorded it, after `delay`.
    fn dispatch_compensation(&mut self, idx: usize, delay: Duration) -> Result<()> {
        let orchestrator = self.orchestrator();
        let row = self.inst.steps.get(&idx).expect("ledger row");
        let (Some(dest), Some(payload)) =
            (&row.compensation_destination, &row.compensation_payload)
        else {
            return Err(Error::Corrupt(format!(
                "step {idx} has no compensation recorded"
            )));
        };
        let msg = self
            .address(idx, &orchestrator)
            .compensation(dest, payload, delay)?;
        let row = self.inst.steps.get_mut(&idx).expect("ledger row");
        row.compensation_state = Some(CompensationState::Dispatched);
        row.compensation_attempts += 1;
        row.compensation_message_id = Some(msg.id);
        self.fx.compensating.get_or_insert_with(|| row.name.clone());
        self.fx.send.push(msg);
        Ok(())
    }

    /// An agent answered step `idx`'s compensation (a lost one reads as retryable).
    pub(super) fn on_compensation_reply(&mut self, idx: usize, out: StepOutcome) -> Result<()> {
        if self.inst.state != SagaState::Compensating {
            return self.ignore(format!(
                "compensation reply for step {idx} while {}",
                self.inst.state
            ));
        }
        let now = self.now_ms;
        let row = self.inst.steps.get_mut(&idx).expect("checked by caller");
        if row.compensation_state != Some(CompensationState::Dispatched) {
            return self.ignore(format!("duplicate compensation reply for step {idx}"));
        }
        match out {
            StepOutcome::Ok(_) => {
                row.compensation_state = Some(CompensationState::Done);
                row.compensation_error = None;
                row.compensated_at = Some(now);
                self.advance_compensation()
            }
            StepOutcome::Retryable(e) | StepOutcome::Fatal(e) => {
                row.compensation_error = Some(e.clone());
                let attempts = row.compensation_attempts;
                if self.compensation_retry.exhausted(attempts) {
                    row.compensation_state = Some(CompensationState::Failed);
                    let name = row.name.clone();
                    self.inst.error = Some(format!(
                        "compensation of step `{name}` failed {attempts} times: {e}"
                    ));
                    self.transition(SagaEvent::CompensationExhausted)
                } else {
                    let delay = self
                        .compensation_retry
                        .backoff_with(attempts, &mut self.rng);
                    self.dispatch_compensation(idx, delay)
                }
            }
        }
    }
}
