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
    /// Step `idx` is a wait (for its signal, or for its time: a sleep): it is
    /// dispatched with an id of its own (the cause a signal or its wake-up answers),
    /// and with a timer if it has a timeout or wakes by time (then its row's deadline
    /// is the time it wakes). A signal that came first is used at once.
    pub(super) fn dispatch_wait(&mut self, idx: usize, stage: usize, sd: &StepDef) -> Result<()> {
        let wait = MessageId::new();
        let now = self.now_ms;
        if let (Some(name), Some(_)) = (&sd.wait, &sd.approves) {
            self.record_approval(sd, name)?;
        }
        // A time that cannot be computed (data that does not decode, a plan's
        // reference to something that is no time) fails this step, not the one whose
        // reply led here.
        let due = match &sd.wake {
            Some(wake) => wake.due_ms(now, &self.inst.data).map(Some),
            None => Ok(sd.timeout.map(|t| now.saturating_add(millis(t)))),
        };
        let first = self.def()?.stage_range(stage).start == idx;
        let data = &self.inst.data;
        // Nothing to undo, wherever it stands.
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
            .with_data_before(first.then(|| data.to_string()))
        });
        row.state = StepState::Dispatched;
        row.attempts += 1;
        row.command_id = Some(wait);
        row.dispatched_at = Some(now);
        let due = match due {
            Ok(due) => due,
            Err(e) => {
                row.deadline_ms = None;
                let old = row.timer_id.take();
                self.fx.cancel.extend(old);
                return self.fail_step(idx, format!("its time cannot be computed: {e}"));
            }
        };
        row.deadline_ms = due;
        let old = row.timer_id.take();
        self.fx.cancel.extend(old);
        if let Some(outcome) = sd.wait.as_ref().and_then(|n| self.signals.get(n)).cloned() {
            return self.on_reply(idx, wait, outcome, Default::default());
        }
        if let Some(due) = due {
            // At least 1 ms: a time already past wakes the saga at once, through its
            // orchestrator like any other wake-up.
            let after =
                Duration::from_millis(u64::try_from(due.saturating_sub(now)).unwrap_or(0).max(1));
            let orchestrator = self.orchestrator();
            let timer = self.address(idx, &orchestrator).wait_timer(wait, after);
            if let Some(row) = self.inst.steps.get_mut(&idx) {
                row.timer_id = Some(timer.id);
            }
            self.fx.send.push(timer);
        }
        Ok(())
    }

    /// Step `idx`'s wake-up `causation` came: a sleep, or a wait whose signal did not
    /// come in time (`or_after`), succeeds without a reply and the saga goes on. A
    /// wake-up the step no longer waits for (its signal came, the saga turned back) is
    /// ignored.
    pub(crate) fn on_wake(&mut self, idx: usize, causation: MessageId) -> Result<()> {
        let Some(row) = self.inst.steps.get(&idx) else {
            return self.ignore(format!(
                "wake-up for step {idx}, which was never dispatched"
            ));
        };
        if row.command_id != Some(causation) || row.state != StepState::Dispatched {
            return self.ignore(format!("late or duplicate wake-up for step {idx}"));
        }
        let output = serde_json::json!({"woke": "time", "due": row.deadline_ms});
        // In flight beside a step past the pivot that failed (the saga is stuck going
        // forward), it is done all the same: an operator's retry of the failed steps
        // then finds its stage answered.
        let stuck =
            self.inst.state == SagaState::Stuck && self.inst.failed_compensation().is_none();
        if self.inst.state != SagaState::Running && !stuck {
            return self.ignore(format!("wake-up for step {idx} while {}", self.inst.state));
        }
        self.cancel_timer(idx);
        let now = self.now_ms;
        let row = self.inst.steps.get_mut(&idx).expect("checked");
        row.state = StepState::Succeeded;
        row.output = Some(output);
        row.error = None;
        row.replied_at = Some(now);
        if stuck {
            return Ok(());
        }
        self.advance_forward()
    }

    /// Whether step `idx` wakes by time (a sleep, or a wait with `or_after`): then its
    /// timer's message is its wake-up, not a timeout.
    pub(crate) fn wakes(&self, idx: usize) -> bool {
        self.def
            .as_deref()
            .and_then(|d| d.step(idx))
            .is_some_and(|s| s.wake.is_some())
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
