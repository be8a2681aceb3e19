//! An operator's pause: a paused saga sends nothing new. What would go next is held in
//! its pause record ([`PauseRecord`]) and sent when it is resumed.

use std::time::Duration;

use super::Ctx;
use super::budget::Dispatch;
use crate::engine::model::PauseRecord;
use crate::{Paused, Result, SagaState, StepState, protocol};

impl Ctx<'_> {
    /// Is the saga paused?
    pub(super) fn paused(&self) -> bool {
        self.inst.pause.as_ref().is_some_and(|p| p.paused.is_some())
    }

    /// Holds `what` back if the saga is paused: whether it did.
    pub(super) fn hold(&mut self, what: Dispatch) -> bool {
        if !self.paused() {
            return false;
        }
        let record = self.inst.pause.as_mut().expect("paused");
        match what {
            Dispatch::NextStage => record.next_stage = true,
            Dispatch::Again(idx) if !record.steps.contains(&idx) => record.steps.push(idx),
            Dispatch::Again(_) => {}
        }
        true
    }

    /// Holds step `idx`'s compensation back if the saga is paused: whether it did.
    pub(super) fn hold_compensation(&mut self, idx: usize) -> bool {
        if !self.paused() {
            return false;
        }
        let record = self.inst.pause.as_mut().expect("paused");
        if !record.compensations.contains(&idx) {
            record.compensations.push(idx);
        }
        true
    }

    /// An operator pauses the saga: `by`, for `reason`. Refused for a finished saga or
    /// one paused already.
    pub(crate) fn pause(&mut self, by: &str, reason: &str) -> Result<()> {
        if self.inst.state.is_terminal() {
            return Err(self.wrong("pause", ": it is finished".into()));
        }
        if self.paused() {
            return Err(self.wrong("pause", ": it is paused already".into()));
        }
        let paused = Paused {
            by: by.to_owned(),
            reason: reason.to_owned(),
            at_ms: self.now_ms,
        };
        self.inst
            .pause
            .get_or_insert_with(PauseRecord::default)
            .paused = Some(paused);
        Ok(())
    }

    /// An operator resumes the paused saga: what it held back goes now, or, without the
    /// definition here, once its orchestrator is woken by the message this sends it.
    pub(crate) fn resume(&mut self) -> Result<()> {
        if !self.paused() {
            return Err(self.wrong("resume", ": it is not paused".into()));
        }
        let record = self.inst.pause.as_mut().expect("paused");
        record.paused = None;
        if self.def.is_some() {
            return self.release_paused();
        }
        if *record == PauseRecord::default() {
            self.inst.pause = None;
        } else {
            let wake = protocol::resumed(self.inst.id, &self.orchestrator());
            self.fx.send.push(wake);
        }
        Ok(())
    }

    /// Sends what the pause held back, once the saga is resumed (and not paused again
    /// meanwhile): the steps and the next stage of a running saga, the compensations
    /// of one that turned back. A stuck or finished saga needs them no more (an
    /// operator's retry sends what a stuck one needs).
    pub(super) fn release_paused(&mut self) -> Result<()> {
        if self.paused() {
            return self.ignore("resumed, but paused again since");
        }
        let Some(record) = self.inst.pause.take() else {
            return self.ignore("resumed: nothing was held back");
        };
        match self.inst.state {
            SagaState::Running if record.stage.is_some() => {
                self.send_stage_afresh(record.stage.expect("checked"))
            }
            SagaState::Running => {
                for idx in record.steps {
                    match self.inst.steps.get(&idx).map(|r| r.state) {
                        Some(StepState::Dispatched) => {
                            if self.budget_allows(Dispatch::Again(idx))? {
                                self.dispatch_step(idx, Duration::ZERO)?;
                            }
                        }
                        // Never sent: it goes as the budget has room, with its stage.
                        None => self.pending_for_budget(idx),
                        Some(_) => {}
                    }
                }
                if record.next_stage {
                    self.advance_forward()
                } else {
                    self.release_pending()
                }
            }
            SagaState::Compensating => {
                for idx in record.compensations {
                    self.dispatch_compensation(idx, Duration::ZERO)?;
                }
                Ok(())
            }
            state => self.ignore(format!("resumed: the saga is {state}")),
        }
    }
}
