//! Forward: the saga's start, each stage's steps dispatched (with their ledger entries
//! and timers), and the agents' replies folded in until the last stage succeeds.

use std::time::Duration;

use agentsaga_core::MessageId;

use super::budget::Dispatch;
use super::{Ctx, millis};
use crate::budget::{BudgetRecord, Usage};
use crate::definition::step::Undo;
use crate::engine::model::StepRow;
use crate::protocol::{self, StepOutcome};
use crate::{CompensationState, Error, Result, SagaEvent, SagaState, StepState};

impl Ctx<'_> {
    /// Starts the saga, which `waited` for admission: its deadline counts from when
    /// it was accepted.
    pub(crate) fn start(&mut self, waited: Duration) -> Result<()> {
        let def = self.def()?;
        let (deadline, budget) = (def.deadline, def.budget);
        self.fx.waits = def.declared_waits();
        self.inst.budget = budget.map(|(limit, on_spent)| BudgetRecord {
            limit,
            on_spent,
            ..BudgetRecord::default()
        });
        if let Some(deadline) = deadline {
            let timer = protocol::deadline_timer(
                self.inst.id,
                &self.orchestrator(),
                deadline.saturating_sub(waited),
            );
            self.fx.send.push(timer);
        }
        self.dispatch_stage(0)
    }

    /// Sends stage `stage`'s steps, as many as the budget has room for while the
    /// others are on their way (see `room_for_one`); the rest wait for answers.
    pub(super) fn dispatch_stage(&mut self, stage: usize) -> Result<()> {
        self.inst.stage = stage;
        for idx in self.def()?.stage_range(stage) {
            if self.room_for_one() {
                self.dispatch_step(idx, Duration::ZERO)?;
            } else if let Some(record) = &mut self.inst.budget {
                record.pending.push(idx);
            }
        }
        Ok(())
    }

    /// Sends step `idx`'s command (again) after `delay`, with its start timer. The
    /// first dispatch also writes the compensation-ledger entry, in this same
    /// transaction (without its payload for a compensation built from the reply).
    pub(super) fn dispatch_step(&mut self, idx: usize, delay: Duration) -> Result<()> {
        let def = self.def()?;
        let sd = def
            .step(idx)
            .ok_or_else(|| Error::Corrupt(format!("no step {idx}")))?
            .clone();
        let stage = def.steps().nth(idx).map(|(s, _)| s).unwrap_or_default();
        if sd.wait.is_some() || sd.wake.is_some() {
            return self.dispatch_wait(idx, stage, &sd);
        }
        let command = (sd.command)(&self.inst.data)?;
        if !self.inst.steps.contains_key(&idx) {
            let (compensation_state, compensation_destination, compensation_payload) =
                match &sd.undo {
                    Undo::Never => (None, None, None),
                    Undo::Nothing => (Some(CompensationState::NotNeeded), None, None),
                    Undo::Command { destination, build } => (
                        Some(CompensationState::Recorded),
                        Some(destination.clone()),
                        Some(build(&self.inst.data)?),
                    ),
                    // That the step must be undone is recorded now; its payload, when
                    // the compensation is dispatched, from the step's reply.
                    Undo::FromReply { destination, .. } => (
                        Some(CompensationState::Recorded),
                        Some(destination.clone()),
                        None,
                    ),
                };
            let first = def.stage_range(stage).start == idx;
            let data_before = first.then(|| self.inst.data.to_string());
            self.inst.steps.insert(
                idx,
                StepRow::first_dispatch(
                    idx,
                    stage,
                    &sd.name,
                    &sd.destination,
                    compensation_state,
                    compensation_destination,
                    compensation_payload,
                )
                .with_data_before(data_before),
            );
        }
        let orchestrator = self.orchestrator();
        let address = self.address(idx, &orchestrator);
        let mut msg = address.command(&sd.destination, &command, delay, sd.timeout)?;
        if crate::definition::child_of(&sd.destination).is_some() {
            // What the child's start checks its limits with, so that it reads nothing
            // of the parent.
            let depth = self.inst.parent.as_ref().map_or(0, |l| l.depth) + 1;
            let before = self
                .inst
                .steps
                .values()
                .filter(|r| r.idx != idx && crate::definition::child_of(&r.destination).is_some())
                .count();
            msg = self.with_child_run(
                idx,
                msg.header(protocol::CHILD_DEPTH, depth.to_string())
                    .header(protocol::CHILDREN_BEFORE, before.to_string()),
            );
        }
        // The step's `timeout` is the agent's to enforce, from when it starts; the
        // orchestrator keeps a timer only for the optional schedule-to-start bound.
        let timer = sd
            .start_timeout
            .map(|t| address.start_timer(msg.id, delay + t));
        let now = self.now_ms;
        let row = self.inst.steps.get_mut(&idx).expect("inserted above");
        row.state = StepState::Dispatched;
        row.attempts += 1;
        row.input = Some(command);
        row.command_id = Some(msg.id);
        row.dispatched_at = Some(now);
        row.deadline_ms = sd.start_timeout.map(|t| now + millis(delay + t));
        if let Some(old) = row.timer_id.take() {
            self.fx.cancel.push(old);
        }
        row.timer_id = timer.as_ref().map(|t| t.id);
        self.fx.send.push(msg);
        self.fx.send.extend(timer);
        Ok(())
    }

    /// An agent answered `causation`, step `idx`'s command or its compensation.
    pub(super) fn on_reply(
        &mut self,
        idx: usize,
        causation: MessageId,
        out: StepOutcome,
        (usage, bad_usage): (Usage, Option<String>),
    ) -> Result<()> {
        if !self.inst.steps.contains_key(&idx) {
            return self.ignore(format!("reply for step {idx}, which was never dispatched"));
        }
        // What the work used counts whatever becomes of the reply (late, or while the
        // saga turned back): it was spent. The inbox counts each reply once.
        self.record_usage(idx, usage);
        let row = self.inst.steps.get(&idx).expect("checked");
        if row.compensation_message_id == Some(causation) {
            if let Some(why) = bad_usage {
                // An undo is not held up by its accounting.
                tracing::warn!(saga.id = %self.inst.id, step = idx, %why, "a compensation's usage is not counted");
            }
            return self.on_compensation_reply(idx, out);
        }
        if row.command_id != Some(causation) || row.state != StepState::Dispatched {
            return self.ignore(format!("late or duplicate reply for step {idx}"));
        }
        if let Some(why) = bad_usage {
            if self.inst.state != SagaState::Running {
                return self.ignore(format!("reply for step {idx} while {}", self.inst.state));
            }
            self.cancel_timer(idx);
            return self.fail_step(idx, why);
        }
        if self.inst.state == SagaState::Stuck && self.inst.failed_compensation().is_none() {
            return self.on_reply_while_stuck(idx, out);
        }
        if self.inst.state != SagaState::Running {
            return self.ignore(format!("reply for step {idx} while {}", self.inst.state));
        }
        self.cancel_timer(idx);
        let now = self.now_ms;
        match out {
            StepOutcome::Ok(value) => {
                let fold = self.def()?.step(idx).and_then(|s| s.fold.clone());
                if let Some(fold) = fold
                    && let Err(e) = fold(&mut self.inst.data, value.clone())
                {
                    let why = match e {
                        Error::InvalidPlan(_) => format!("the planner's {e}"),
                        e => format!("the reply did not decode: {e}"),
                    };
                    return self.fail_step(idx, why);
                }
                self.replan(idx)?;
                let row = self.inst.steps.get_mut(&idx).expect("checked");
                row.state = StepState::Succeeded;
                row.output = Some(value);
                row.error = None;
                row.replied_at = Some(now);
                self.advance_forward()
            }
            StepOutcome::Retryable(e) => {
                let def = self.def()?;
                let policy = def.step(idx).map(|s| s.retry).unwrap_or_default();
                let forward_only = def.after_pivot(idx);
                let row = self.inst.steps.get_mut(&idx).expect("checked");
                row.error = Some(e.clone());
                row.replied_at = Some(now);
                let attempts = row.attempts;
                if forward_only || !policy.exhausted(attempts) {
                    let delay = policy.backoff_with(attempts, &mut self.rng);
                    if !self.budget_allows(Dispatch::Again(idx))? {
                        return Ok(());
                    }
                    self.dispatch_step(idx, delay)
                } else {
                    self.recover_or_fail(idx, format!("{e} (gave up after {attempts} attempts)"))
                }
            }
            StepOutcome::Fatal(e) => {
                if let Some(row) = self.inst.steps.get_mut(&idx) {
                    row.replied_at = Some(now);
                }
                self.recover_or_fail(idx, e)
            }
        }
    }

    /// Step `idx`, in flight beside a step past the pivot that failed (the saga is
    /// stuck going forward), answered: its outcome is kept, so that once an operator's
    /// retry of the failed steps succeeds the stage is done (a failure of its own is
    /// retried with them). The saga stays stuck.
    fn on_reply_while_stuck(&mut self, idx: usize, out: StepOutcome) -> Result<()> {
        self.cancel_timer(idx);
        let now = self.now_ms;
        let error = match out {
            StepOutcome::Ok(value) => {
                let fold = self.def()?.step(idx).and_then(|s| s.fold.clone());
                match fold.map(|f| f(&mut self.inst.data, value.clone())) {
                    Some(Err(e)) => Some(format!("the reply did not decode: {e}")),
                    _ => {
                        let row = self.inst.steps.get_mut(&idx).expect("checked");
                        row.output = Some(value);
                        None
                    }
                }
            }
            StepOutcome::Retryable(e) | StepOutcome::Fatal(e) => Some(e),
        };
        let row = self.inst.steps.get_mut(&idx).expect("checked");
        row.replied_at = Some(now);
        row.state = if error.is_some() {
            StepState::Failed
        } else {
            StepState::Succeeded
        };
        row.error = error;
        Ok(())
    }

    /// A planned saga's steps may have grown (its planner replied with the plan, or
    /// with a turn's stages): its definition is made again from the data, and the new
    /// waits are registered.
    fn replan(&mut self, idx: usize) -> Result<()> {
        let def = self.def()?;
        let turn = def
            .planned
            .as_ref()
            .zip(def.step(idx))
            .is_some_and(|(p, s)| p.is_turn(&s.name));
        if !turn {
            return Ok(());
        }
        let before: Vec<String> = def.waits().into_iter().map(str::to_owned).collect();
        let def =
            crate::SagaDefinition::for_data(&self.def.clone().expect("checked"), &self.inst.data)?;
        self.fx.waits.extend(
            def.declared_waits()
                .into_iter()
                .filter(|w| !before.contains(&w.name)),
        );
        self.def = Some(def);
        Ok(())
    }

    /// Once every step of the current stage succeeded: the next stage, or `completed`.
    pub(super) fn advance_forward(&mut self) -> Result<()> {
        self.release_pending()?;
        if self.inst.state != SagaState::Running {
            return Ok(());
        }
        let def = self.def()?;
        let range = def.stage_range(self.inst.stage);
        let stages = def.stages.len();
        // A failed member is done too while the planner is to be asked about it
        // (`replan_on_failure`): the stage has answered once its siblings have.
        let recovering = crate::plan::recovering(&self.inst.data);
        let done = range
            .clone()
            .all(|i| match self.inst.steps.get(&i).map(|r| r.state) {
                Some(StepState::Succeeded) => true,
                Some(StepState::Failed) => recovering,
                _ => false,
            });
        if !done {
            return Ok(());
        }
        if self.inst.stage + 1 < stages {
            if !self.budget_allows(Dispatch::NextStage)? {
                return Ok(());
            }
            self.dispatch_stage(self.inst.stage + 1)
        } else {
            self.inst.error = None;
            self.transition(SagaEvent::AllStepsSucceeded)
        }
    }
}
