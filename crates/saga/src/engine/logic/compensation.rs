//! Compensation: the steps taken are undone from the ledger, the latest stage first
//! (a stage's compensations together), each retried per the compensation policy; when
//! one exhausts it the saga is stuck.
//!
//! A compensation built from its step's reply (`compensate_with`) has no payload in
//! the ledger until it is first dispatched: it is built then, from the saga data and
//! the reply (`None` unless the step succeeded), and recorded. Building needs the
//! definition; a process without it (an operator's) asks the saga's orchestrator to
//! build and send it. One that cannot be built leaves the saga stuck, with the reason.

use std::time::Duration;

use agentsaga_core::MessageId;

use super::Ctx;
use crate::definition::step::Undo;
use crate::engine::model::StepRow;
use crate::protocol::StepOutcome;
use crate::{CompensationState, Error, Result, SagaEvent, SagaState, StepState};

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
        // A rewind undoes down to its step's stage, and then turns forward again.
        let floor = self.rewind_floor();
        let Some(stage) = self
            .inst
            .steps
            .values()
            .filter(|r| open(r) && r.stage >= floor.unwrap_or(0))
            .map(|r| r.stage)
            .max()
        else {
            if floor.is_some() {
                return self.rewound();
            }
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
        // All of the stage's payloads first: when one cannot be built, none goes out
        // (the saga is stuck, and a retry or skip dispatches the stage as a whole).
        if !self.build_compensations(&idxs)? {
            return Ok(());
        }
        for idx in idxs {
            self.dispatch_compensation(idx, Duration::ZERO)?;
        }
        Ok(())
    }

    /// Builds from their step's reply, and records in the ledger, the compensations of
    /// `idxs` that are built so and not built yet. Without the definition nothing is
    /// built here (the orchestrator that has it will be asked). `false`, with the saga
    /// stuck, if one cannot be built; nothing is recorded then.
    fn build_compensations(&mut self, idxs: &[usize]) -> Result<bool> {
        let Some(def) = self.def.clone() else {
            return Ok(true);
        };
        let mut built = Vec::new();
        for &idx in idxs {
            let row = self.inst.steps.get(&idx).expect("ledger row");
            if row.compensation_payload.is_some() {
                continue;
            }
            let Some(Undo::FromReply { build, .. }) = def.step(idx).map(|s| &s.undo) else {
                return Err(Error::Corrupt(format!(
                    "step {idx} has no compensation recorded, and its definition builds none"
                )));
            };
            // The reply only of a step that succeeded: any other outcome is unknown.
            let reply = row
                .output
                .as_ref()
                .filter(|_| row.state == StepState::Succeeded);
            match build(&self.inst.data, reply) {
                Ok(payload) => built.push((idx, payload)),
                Err(why) => {
                    self.cannot_build(idx, why)?;
                    return Ok(false);
                }
            }
        }
        for (idx, payload) in built {
            let row = self.inst.steps.get_mut(&idx).expect("ledger row");
            row.compensation_payload = Some(payload);
        }
        Ok(true)
    }

    /// Step `idx`'s compensation cannot be built (its step's reply is not what the
    /// compensation decodes): no retry can help, the saga is stuck for an operator.
    fn cannot_build(&mut self, idx: usize, why: String) -> Result<()> {
        let row = self.inst.steps.get_mut(&idx).expect("ledger row");
        row.compensation_state = Some(CompensationState::Failed);
        row.compensation_error = Some(why.clone());
        self.inst.error = Some(format!(
            "compensation of step `{}` cannot be built: {why}",
            row.name
        ));
        self.transition(SagaEvent::CompensationExhausted)
    }

    /// Sends step `idx`'s compensation, as the ledger recorded it, after `delay`; one
    /// that is built from its step's reply and not built yet (this process lacks the
    /// definition) is asked of the saga's orchestrator instead.
    pub(super) fn dispatch_compensation(&mut self, idx: usize, delay: Duration) -> Result<()> {
        // A paused saga sends nothing new: held until it is resumed.
        if self.hold_compensation(idx) {
            return Ok(());
        }
        let orchestrator = self.orchestrator();
        let row = self.inst.steps.get(&idx).expect("ledger row");
        let Some(dest) = &row.compensation_destination else {
            return Err(Error::Corrupt(format!(
                "step {idx} has no compensation recorded"
            )));
        };
        let address = self.address(idx, &orchestrator);
        let Some(payload) = &row.compensation_payload else {
            if self.def.is_some() {
                return Err(Error::Corrupt(format!(
                    "step {idx}'s compensation was not built"
                )));
            }
            let request = address.build_compensation().delay(delay);
            let row = self.inst.steps.get_mut(&idx).expect("ledger row");
            row.compensation_state = Some(CompensationState::Dispatched);
            row.compensation_message_id = Some(request.id);
            self.fx.compensating.get_or_insert_with(|| row.name.clone());
            self.fx.send.push(request);
            return Ok(());
        };
        let mut msg = address.compensation(dest, payload, delay)?;
        if crate::definition::child_of(dest).is_some() {
            msg = self.with_child_run(idx, msg);
        }
        let row = self.inst.steps.get_mut(&idx).expect("ledger row");
        row.compensation_state = Some(CompensationState::Dispatched);
        row.compensation_attempts += 1;
        row.compensation_message_id = Some(msg.id);
        self.fx.compensating.get_or_insert_with(|| row.name.clone());
        self.fx.send.push(msg);
        Ok(())
    }

    /// A process without the definition asked for step `idx`'s compensation to be
    /// built from its reply and sent: done, unless the request is stale.
    pub(super) fn on_build_compensation(&mut self, idx: usize, request: MessageId) -> Result<()> {
        let pending = self.inst.steps.get(&idx).is_some_and(|r| {
            r.compensation_message_id == Some(request)
                && r.compensation_state == Some(CompensationState::Dispatched)
        });
        if !pending || self.inst.state != SagaState::Compensating {
            return self.ignore(format!(
                "stale request to build the compensation of step {idx}"
            ));
        }
        if self.build_compensations(&[idx])? {
            self.dispatch_compensation(idx, Duration::ZERO)?;
        }
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
