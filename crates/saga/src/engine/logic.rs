//! The saga engine's decisions, on the in-memory instance: which messages to send,
//! which timers to cancel, which state comes next. No I/O here: the engine loads the
//! instance, a [`Ctx`] decides, the engine writes the instance and the [`Effects`].
//!
//! One concept per file: `forward` runs the steps; `failure` decides what a failed,
//! lost or unprocessable step means (compensate, send again, or stuck); `compensation`
//! undoes the steps taken, latest stage first; `operator` is what an operator may do
//! to a saga. Every change of the saga's state goes through the
//! lifecycle table ([`SagaState::on`]); an event it does not allow is an error, and the
//! engine then writes nothing.

mod budget;
mod child;
mod compensation;
mod failure;
mod forward;
mod operator;
mod pause;
mod recovery;
mod rewind;
#[cfg(test)]
mod tests;
mod wait;

use agentsaga_core::clock::millis;
use agentsaga_core::{Message, MessageId, RetryPolicy};

use std::collections::BTreeMap;
use std::sync::Arc;

use super::model::Instance;
use crate::protocol::{Inbound, StepAddress, StepOutcome};
use crate::{Error, Result, SagaDefinition, SagaEvent, SagaState};

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
    /// The lifecycle transitions taken, in order, as (from, event).
    pub(crate) transitions: Vec<(SagaState, SagaEvent)>,
    /// Waits whose `saga_signals` rows to write (at the start, or once a planned saga
    /// has its plan).
    pub(crate) waits: Vec<crate::definition::DeclaredWait>,
    /// Step rows to delete, from this index on (a rewind's undone steps).
    pub(crate) drop_steps_from: Option<usize>,
    /// Waits whose received signals to forget (a rewind's, before they run again).
    pub(crate) reset_signals: Vec<String>,
    /// Waits whose rows to delete (a rewind's approvals of commands, registered again
    /// when reached).
    pub(crate) drop_signals: Vec<String>,
}

/// Ties the instance, its definition and the clock together while deciding.
pub(crate) struct Ctx<'a> {
    pub(crate) inst: &'a mut Instance,
    /// `None` when this process lacks the instance's version: operators may still act
    /// on the compensation ledger.
    pub(crate) def: Option<Arc<SagaDefinition>>,
    pub(crate) compensation_retry: RetryPolicy,
    pub(crate) now_ms: i64,
    pub(crate) fx: Effects,
    pub(crate) rng: fastrand::Rng,
    /// The signals the saga has received, by wait name (loaded only for a saga whose
    /// definition waits).
    pub(crate) signals: BTreeMap<String, StepOutcome>,
    /// The budgets of the saga's tree that its dispatches also count against (loaded
    /// only for a child saga, or one with children).
    pub(crate) spenders: Vec<super::model::Spender>,
}

impl Ctx<'_> {
    /// Applies what the orchestrator received. A [`Inbound::StartTimeout`] reaches
    /// here only once its command is withdrawn (no agent took it in time).
    pub(crate) fn receive(&mut self, msg: Inbound) -> Result<()> {
        match msg {
            Inbound::Reply {
                step,
                causation,
                outcome,
                usage,
                bad_usage,
            } => self.on_reply(step, causation, outcome, (usage, bad_usage)),
            Inbound::Timeout { step, causation } if self.wakes(step) => {
                self.on_wake(step, causation)
            }
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
            Inbound::BudgetRaised => self.release_held(),
            Inbound::Resumed => self.release_paused(),
            Inbound::BuildCompensation { step, request } => {
                self.on_build_compensation(step, request)
            }
            Inbound::Signal { name } => self.on_signal(&name),
        }
    }

    /// The event changes nothing: say why, for the logs.
    pub(crate) fn ignore(&mut self, why: impl Into<String>) -> Result<()> {
        self.fx.ignored = Some(why.into());
        Ok(())
    }

    /// Cancels step `idx`'s timer, if it has one.
    pub(crate) fn cancel_timer(&mut self, idx: usize) {
        let timer = self
            .inst
            .steps
            .get_mut(&idx)
            .and_then(|r| r.timer_id.take());
        self.fx.cancel.extend(timer);
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
        self.fx.transitions.push((from, event));
        if self.inst.finished {
            // Nothing is left to hold back or send.
            self.inst.pause = None;
            self.answer_parent()?;
        }
        Ok(())
    }

    fn def(&self) -> Result<&SagaDefinition> {
        self.def
            .as_deref()
            .ok_or_else(|| Error::VersionNotRegistered {
                name: self.inst.name.clone(),
                version: self.inst.version,
            })
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

    /// Has the pivot been dispatched? Then the saga can only go forward. Read from the
    /// ledger alone (the pivot and the steps after it are exactly the rows without a
    /// compensation entry), so operators can act without the definition.
    fn past_pivot(&self) -> bool {
        self.inst
            .steps
            .values()
            .any(|r| r.compensation_state.is_none())
    }
}
