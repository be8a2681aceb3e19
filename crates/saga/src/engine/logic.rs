//! The saga engine's decisions, on the in-memory instance: which messages to send,
//! which timers to cancel, which state comes next. No I/O here.

use agentsaga_core::{Message, MessageId, RetryPolicy};

use super::model::{Instance, StepRow};
use crate::protocol::{self, Inbound, StepAddress, StepOutcome};
use crate::{CompState, Error, Result, SagaDefinition, SagaEvent, SagaState, StepState};

/// What one transaction must write besides the instance: messages, and pending
/// messages to delete.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    pub(crate) send: Vec<Message>,
    pub(crate) cancel: Vec<MessageId>,
    /// Why an event changed nothing (late, duplicate...), for the logs.
    pub(crate) ignored: Option<String>,
    /// The step whose compensation is sent first, if any (names the trace's span).
    pub(crate) compensating: Option<String>,
}

/// Ties the instance, its definition and the clock together while deciding.
pub(crate) struct Ctx<'a> {
    pub(crate) inst: &'a mut Instance,
    pub(crate) def: Option<&'a SagaDefinition>,
    pub(crate) comp_retry: RetryPolicy,
    pub(crate) now_ms: i64,
    pub(crate) fx: Effects,
    pub(crate) rng: fastrand::Rng,
}

impl Ctx<'_> {
    fn def(&self) -> Result<&SagaDefinition> {
        self.def.ok_or_else(|| Error::VersionNotRegistered {
            name: self.inst.name.clone(),
            version: self.inst.version,
        })
    }

    /// Moves the saga along the lifecycle table. An event the table does not allow
    /// is an error: the caller's transaction, and every change made to the instance
    /// while deciding, must be dropped.
    fn transition(&mut self, event: SagaEvent) -> Result<()> {
        let from = self.inst.state;
        let next = from.on(event)?;
        tracing::debug!(saga.id = %self.inst.id, %from, to = %next, ?event, "saga transition");
        self.inst.state = next;
        self.inst.finished = next.is_terminal();
        Ok(())
    }

    pub(crate) fn ignore(&mut self, why: impl Into<String>) -> Result<()> {
        self.fx.ignored = Some(why.into());
        Ok(())
    }

    fn orchestrator(&self) -> String {
        crate::orchestrator_destination(&self.inst.name, self.inst.version)
    }

    /// What the messages about step `idx` (a row of the ledger) are addressed with.
    fn address<'s>(&'s self, idx: usize, orchestrator: &'s str) -> StepAddress<'s> {
        StepAddress {
            saga: self.inst.id,
            step: idx,
            name: self.inst.steps.get(&idx).map_or("", |r| r.name.as_str()),
            orchestrator,
        }
    }

    /// Applies what the orchestrator received. A [`Inbound::StartTimeout`] reaches
    /// here only once its command is withdrawn (no agent took it in time).
    pub(crate) fn receive(&mut self, msg: Inbound) -> Result<()> {
        match msg {
            Inbound::Reply {
                step,
                causation,
                outcome,
            } => self.on_reply(step, causation, outcome),
            Inbound::Timeout { step, causation } => {
                self.on_lost(step, causation, "timed out: the outcome is unknown".into())
            }
            Inbound::StartTimeout { step, causation } => self.on_lost(
                step,
                causation,
                "not started within its start timeout".into(),
            ),
            Inbound::DeliveryFailed {
                step,
                message,
                destination,
                reason,
            } => self.on_lost(
                step,
                message,
                format!("delivery to `{destination}` failed: {reason}"),
            ),
            Inbound::Deadline => self.on_deadline(),
        }
    }

    // ----- forward -------------------------------------------------------------------

    /// Starts the saga, which `waited` for admission: its deadline counts from when
    /// it was accepted.
    pub(crate) fn start(&mut self, waited: std::time::Duration) -> Result<()> {
        let deadline = self.def()?.deadline;
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

    fn dispatch_stage(&mut self, stage: usize) -> Result<()> {
        self.inst.stage = stage;
        for idx in self.def()?.stage_range(stage) {
            self.dispatch_step(idx, std::time::Duration::ZERO)?;
        }
        Ok(())
    }

    /// Sends step `idx`'s command (again), with its timeout timer. The first dispatch
    /// also writes the compensation-ledger entry, in this same transaction.
    fn dispatch_step(&mut self, idx: usize, delay: std::time::Duration) -> Result<()> {
        let def = self.def()?;
        let sd = def
            .step(idx)
            .ok_or_else(|| Error::Corrupt(format!("no step {idx}")))?
            .clone();
        let stage = def.steps().nth(idx).map(|(s, _)| s).unwrap_or_default();
        let command = (sd.command)(&self.inst.data)?;
        if !self.inst.steps.contains_key(&idx) {
            let (comp_state, comp_destination, comp_payload) = match &sd.undo {
                crate::definition::Undo::Never => (None, None, None),
                crate::definition::Undo::Nothing => (Some(CompState::NotNeeded), None, None),
                crate::definition::Undo::Command { destination, build } => (
                    Some(CompState::Recorded),
                    Some(destination.clone()),
                    Some(build(&self.inst.data)?),
                ),
            };
            self.inst.steps.insert(
                idx,
                StepRow {
                    idx,
                    stage,
                    name: sd.name.clone(),
                    destination: sd.destination.clone(),
                    state: StepState::Dispatched,
                    attempts: 0,
                    command_id: None,
                    timer_id: None,
                    input: None,
                    output: None,
                    error: None,
                    comp_destination,
                    comp_payload,
                    comp_state,
                    comp_attempts: 0,
                    comp_message_id: None,
                    comp_error: None,
                    deadline_ms: None,
                    dispatched_at: None,
                    replied_at: None,
                    compensated_at: None,
                },
            );
        }
        let orchestrator = self.orchestrator();
        let address = self.address(idx, &orchestrator);
        let msg = address.command(&sd.destination, &command, delay, sd.timeout)?;
        // The step's `timeout` is the agent's to enforce, from when it starts; the
        // orchestrator keeps a timer only for the optional schedule-to-start bound.
        let timer = sd
            .start_timeout
            .map(|t| address.start_timer(msg.message_id(), delay + t));
        let now = self.now_ms;
        let row = self.inst.steps.get_mut(&idx).expect("inserted above");
        row.state = StepState::Dispatched;
        row.attempts += 1;
        row.input = Some(command);
        row.command_id = Some(msg.message_id());
        row.dispatched_at = Some(now);
        row.deadline_ms = sd
            .start_timeout
            .map(|t| now + agentsaga_core_millis(delay + t));
        if let Some(old) = row.timer_id.take() {
            self.fx.cancel.push(old);
        }
        row.timer_id = timer.as_ref().map(Message::message_id);
        self.fx.send.push(msg);
        self.fx.send.extend(timer);
        Ok(())
    }

    pub(crate) fn on_reply(
        &mut self,
        idx: usize,
        causation: MessageId,
        out: StepOutcome,
    ) -> Result<()> {
        let Some(row) = self.inst.steps.get(&idx) else {
            return self.ignore(format!("reply for step {idx}, which was never dispatched"));
        };
        if row.comp_message_id == Some(causation) {
            return self.on_comp_reply(idx, out);
        }
        if row.command_id != Some(causation) || row.state != StepState::Dispatched {
            return self.ignore(format!("late or duplicate reply for step {idx}"));
        }
        if self.inst.state != SagaState::Running {
            return self.ignore(format!("reply for step {idx} while {}", self.inst.state));
        }
        let timer = self
            .inst
            .steps
            .get_mut(&idx)
            .and_then(|r| r.timer_id.take());
        self.fx.cancel.extend(timer);
        let now = self.now_ms;
        match out {
            StepOutcome::Ok(value) => {
                let fold = self.def()?.step(idx).and_then(|s| s.fold.clone());
                if let Some(fold) = fold
                    && let Err(e) = fold(&mut self.inst.data, value.clone())
                {
                    return self.fail_step(idx, format!("the reply did not decode: {e}"));
                }
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
                    self.dispatch_step(idx, delay)
                } else {
                    self.fail_step(idx, format!("{e} (gave up after {attempts} attempts)"))
                }
            }
            StepOutcome::Fatal(e) => {
                if let Some(row) = self.inst.steps.get_mut(&idx) {
                    row.replied_at = Some(now);
                }
                self.fail_step(idx, e)
            }
        }
    }

    /// The step's outcome is unknown (it timed out) or it was never processed (its
    /// command was dead-lettered).
    pub(crate) fn on_lost(&mut self, idx: usize, message: MessageId, why: String) -> Result<()> {
        let Some(row) = self.inst.steps.get(&idx) else {
            return self.ignore(format!("notice for step {idx}, never dispatched"));
        };
        if row.comp_message_id == Some(message) {
            return self.on_comp_reply(idx, StepOutcome::Retryable(why));
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
        let (forward_only, policy, attempts) =
            (sd.pivot || def.after_pivot(idx), sd.retry, row.attempts);
        if forward_only {
            // Forward only: the command goes again (the agent must be idempotent on the
            // saga id — its inbox sees a new message id).
            let delay = policy.backoff_with(attempts, &mut self.rng);
            let row = self.inst.steps.get_mut(&idx).expect("checked");
            row.error = Some(why);
            return self.dispatch_step(idx, delay);
        }
        let timer = self
            .inst
            .steps
            .get_mut(&idx)
            .and_then(|r| r.timer_id.take());
        self.fx.cancel.extend(timer);
        self.fail_step(idx, why)
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
                    self.transition(SagaEvent::StepFailedAfterPivot)?;
                    return Ok(());
                }
                if self.past_pivot() {
                    self.inst.error = Some(why);
                    self.transition(SagaEvent::StepFailedAfterPivot)?;
                    Ok(())
                } else {
                    self.begin_compensation(SagaEvent::StepFailed, why)
                }
            }
            SagaState::Compensating => {
                self.inst.error = Some(why);
                self.transition(SagaEvent::CompensationExhausted)?;
                Ok(())
            }
            state => self.ignore(format!("cannot process a message while {state}: {why}")),
        }
    }

    fn fail_step(&mut self, idx: usize, error: String) -> Result<()> {
        let after_pivot = self.def()?.after_pivot(idx);
        let row = self.inst.steps.get_mut(&idx).expect("dispatched");
        row.state = StepState::Failed;
        row.error = Some(error.clone());
        let name = row.name.clone();
        let error = format!("step `{name}` failed: {error}");
        if after_pivot {
            self.inst.error = Some(error);
            self.transition(SagaEvent::StepFailedAfterPivot)?;
            Ok(())
        } else {
            self.begin_compensation(SagaEvent::StepFailed, error)
        }
    }

    fn advance_forward(&mut self) -> Result<()> {
        let def = self.def()?;
        let range = def.stage_range(self.inst.stage);
        let stages = def.stages.len();
        let done = range
            .clone()
            .all(|i| self.inst.steps.get(&i).map(|r| r.state) == Some(StepState::Succeeded));
        if !done {
            return Ok(());
        }
        if self.inst.stage + 1 < stages {
            self.dispatch_stage(self.inst.stage + 1)
        } else {
            self.inst.error = None;
            self.transition(SagaEvent::AllStepsSucceeded)?;
            Ok(())
        }
    }

    /// Has the pivot been dispatched? Then the saga can only go forward. Read from the
    /// ledger alone (the pivot and the steps after it are exactly the rows without a
    /// compensation entry), so operators can act without the definition.
    fn past_pivot(&self) -> bool {
        self.inst.steps.values().any(|r| r.comp_state.is_none())
    }

    pub(crate) fn on_deadline(&mut self) -> Result<()> {
        if self.inst.state != SagaState::Running || self.past_pivot() {
            return self.ignore("saga deadline after the pivot or when not running");
        }
        self.begin_compensation(SagaEvent::Abort, "the saga's deadline passed".into())
    }

    // ----- backward ------------------------------------------------------------------

    fn begin_compensation(&mut self, event: SagaEvent, error: String) -> Result<()> {
        self.inst.error = Some(error);
        self.transition(event)?;
        // Timers of steps still in flight are moot now.
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
    fn advance_compensation(&mut self) -> Result<()> {
        let open = |r: &StepRow| {
            matches!(
                r.comp_state,
                Some(CompState::Recorded | CompState::Dispatched | CompState::Failed)
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
            self.transition(SagaEvent::AllCompensated)?;
            return Ok(());
        };
        let idxs: Vec<usize> = self
            .inst
            .steps
            .values()
            .filter(|r| r.stage == stage && r.comp_state == Some(CompState::Recorded))
            .map(|r| r.idx)
            .collect();
        for idx in idxs {
            self.dispatch_compensation(idx, std::time::Duration::ZERO)?;
        }
        Ok(())
    }

    fn dispatch_compensation(&mut self, idx: usize, delay: std::time::Duration) -> Result<()> {
        let orchestrator = self.orchestrator();
        let row = self.inst.steps.get(&idx).expect("ledger row");
        let (Some(dest), Some(payload)) = (&row.comp_destination, &row.comp_payload) else {
            return Err(Error::Corrupt(format!(
                "step {idx} has no compensation recorded"
            )));
        };
        let msg = self
            .address(idx, &orchestrator)
            .compensation(dest, payload, delay)?;
        let row = self.inst.steps.get_mut(&idx).expect("ledger row");
        row.comp_state = Some(CompState::Dispatched);
        row.comp_attempts += 1;
        row.comp_message_id = Some(msg.message_id());
        self.fx.compensating.get_or_insert_with(|| row.name.clone());
        self.fx.send.push(msg);
        Ok(())
    }

    fn on_comp_reply(&mut self, idx: usize, out: StepOutcome) -> Result<()> {
        if self.inst.state != SagaState::Compensating {
            return self.ignore(format!(
                "compensation reply for step {idx} while {}",
                self.inst.state
            ));
        }
        let now = self.now_ms;
        let row = self.inst.steps.get_mut(&idx).expect("checked by caller");
        if row.comp_state != Some(CompState::Dispatched) {
            return self.ignore(format!("duplicate compensation reply for step {idx}"));
        }
        match out {
            StepOutcome::Ok(_) => {
                row.comp_state = Some(CompState::Done);
                row.comp_error = None;
                row.compensated_at = Some(now);
                self.advance_compensation()
            }
            StepOutcome::Retryable(e) | StepOutcome::Fatal(e) => {
                row.comp_error = Some(e.clone());
                let attempts = row.comp_attempts;
                if self.comp_retry.exhausted(attempts) {
                    row.comp_state = Some(CompState::Failed);
                    let name = row.name.clone();
                    self.inst.error = Some(format!(
                        "compensation of step `{name}` failed {attempts} times: {e}"
                    ));
                    self.transition(SagaEvent::CompensationExhausted)?;
                    Ok(())
                } else {
                    let delay = self.comp_retry.backoff_with(attempts, &mut self.rng);
                    self.dispatch_compensation(idx, delay)
                }
            }
        }
    }

    // ----- operators -----------------------------------------------------------------

    pub(crate) fn abort(&mut self) -> Result<()> {
        let state = self.inst.state;
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
                self.transition(SagaEvent::Abort)?;
                Ok(())
            }
            SagaState::Stuck => {
                Err(self.wrong("abort", ": a compensation failed; use retry or skip".into()))
            }
            _ => Err(self.wrong("abort", String::new())),
        }
    }

    pub(crate) fn retry(&mut self) -> Result<()> {
        if self.inst.state != SagaState::Stuck {
            return Err(self.wrong("retry", ": only stuck sagas are retried".into()));
        }
        if let Some(idx) = self.inst.failed_compensation() {
            let row = self.inst.steps.get_mut(&idx).expect("found");
            row.comp_state = Some(CompState::Recorded);
            row.comp_attempts = 0;
            self.transition(SagaEvent::Retry)?;
            return self.advance_compensation();
        }
        if self.def.is_none() {
            return Err(self.wrong(
                "retry",
                ", and its definition is not registered here".into(),
            ));
        }
        let failed: Vec<usize> = self
            .inst
            .steps
            .values()
            .filter(|r| r.state == StepState::Failed)
            .map(|r| r.idx)
            .collect();
        self.transition(SagaEvent::RetryForward)?;
        self.inst.error = None;
        for idx in failed {
            self.dispatch_step(idx, std::time::Duration::ZERO)?;
        }
        Ok(())
    }

    pub(crate) fn skip(&mut self) -> Result<()> {
        let Some(idx) = self
            .inst
            .failed_compensation()
            .filter(|_| self.inst.state == SagaState::Stuck)
        else {
            return Err(self.wrong("skip", ": skip applies to a stuck compensation".into()));
        };
        let now = self.now_ms;
        let row = self.inst.steps.get_mut(&idx).expect("found");
        row.comp_state = Some(CompState::Skipped);
        row.compensated_at = Some(now);
        row.comp_error = Some(format!(
            "{} (skipped by an operator)",
            row.comp_error.clone().unwrap_or_default()
        ));
        self.transition(SagaEvent::Skip)?;
        self.advance_compensation()
    }

    fn wrong(&self, action: &'static str, why: String) -> Error {
        Error::WrongState {
            id: self.inst.id,
            action,
            state: self.inst.state,
            why,
        }
    }
}

fn agentsaga_core_millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}
