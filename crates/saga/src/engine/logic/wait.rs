//! Waits: a step that waits for a named signal (a person's approval, an outside event)
//! instead of sending a command. The saga parks: nothing runs for it until the signal
//! (or the wait's timeout) arrives as a message to its orchestrator.

use std::time::Duration;

use agentsaga_core::MessageId;

use super::{Ctx, millis};
use crate::definition::StepDef;
use crate::engine::model::StepRow;
use crate::{CompensationState, Result, SagaState, StepState};

impl Ctx<'_> {
    /// Step `idx` is the wait for `name`: it is dispatched with an id of its own (the
    /// cause a signal answers), and with a timer if it has a timeout. A signal that
    /// came first is used at once.
    pub(super) fn dispatch_wait(
        &mut self,
        idx: usize,
        stage: usize,
        sd: &StepDef,
        name: &str,
    ) -> Result<()> {
        let wait = MessageId::new();
        let now = self.now_ms;
        if sd.approves.is_some() {
            self.record_approval(sd, name)?;
        }
        let row = self.inst.steps.entry(idx).or_insert_with(|| {
            StepRow::first_dispatch(
                idx,
                stage,
                &sd.name,
                &sd.destination,
                Some(CompensationState::NotNeeded),
                None,
                None,
            )
        });
        row.state = StepState::Dispatched;
        row.attempts += 1;
        row.command_id = Some(wait);
        row.dispatched_at = Some(now);
        row.deadline_ms = sd.timeout.map(|t| now + millis(t));
        let old = row.timer_id.take();
        self.fx.cancel.extend(old);
        if let Some(outcome) = self.signals.get(name).cloned() {
            return self.on_reply(idx, wait, outcome, Default::default());
        }
        if let Some(timeout) = sd.timeout {
            let orchestrator = self.orchestrator();
            let timer = self
                .address(idx, &orchestrator)
                .wait_timer(wait, timeout.max(Duration::from_millis(1)));
            if let Some(row) = self.inst.steps.get_mut(&idx) {
                row.timer_id = Some(timer.id);
            }
            self.fx.send.push(timer);
        }
        Ok(())
    }

    /// The approval wait `sd` (inserted before a command to an `approve_before`
    /// destination) is reached: the command its step will send, references resolved,
    /// is recorded at `/results/<wait>` (once: a record stands), where `sagas show`
    /// and the console show it and the step takes it from; and its signal is
    /// registered now, as a person's decision, so that no approval can come before
    /// the command is there to see.
    fn record_approval(&mut self, sd: &StepDef, name: &str) -> Result<()> {
        let recorded = self
            .inst
            .data
            .get("results")
            .and_then(|r| r.get(&sd.name))
            .is_some();
        if !recorded {
            let record = (sd.command)(&self.inst.data)?;
            crate::plan::record_result(&mut self.inst.data, &sd.name, record)?;
        }
        self.fx.waits.push(crate::engine::DeclaredWait {
            name: name.to_owned(),
            approval: true,
        });
        Ok(())
    }

    /// Signal `name` arrived for this saga: if the saga waits for it now, it goes on
    /// (approved: the payload folds into the data like a reply; rejected: the step
    /// fails). Otherwise it stays recorded for when the saga gets there.
    pub(crate) fn on_signal(&mut self, name: &str) -> Result<()> {
        if self.inst.state != SagaState::Running {
            return self.ignore(format!("signal `{name}` while {}", self.inst.state));
        }
        let def = self.def()?;
        let waiting = def.stage_range(self.inst.stage).find(|&i| {
            def.step(i).and_then(|s| s.wait.as_deref()) == Some(name)
                && self.inst.steps.get(&i).map(|r| r.state) == Some(StepState::Dispatched)
        });
        let Some(idx) = waiting else {
            return self.ignore(format!("signal `{name}` kept until the saga waits for it"));
        };
        let (Some(wait), Some(outcome)) = (
            self.inst.steps.get(&idx).and_then(|r| r.command_id),
            self.signals.get(name).cloned(),
        ) else {
            return self.ignore(format!("signal `{name}` not recorded"));
        };
        self.on_reply(idx, wait, outcome, Default::default())
    }
}
