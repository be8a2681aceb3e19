//! A child saga's side of its parent's step: its answer once it is finished, and its
//! undo when the parent turns back.

use serde_json::Value;

use super::Ctx;
use crate::protocol::{self, StepOutcome};
use crate::{Result, SagaEvent, SagaState};

impl Ctx<'_> {
    /// The parent asks this child to be undone (the parent's compensation `by`): a
    /// completed child compensates its steps, latest first, as if it had failed after
    /// its last; a running one is aborted (compensated). One that is finished otherwise
    /// answers at once; one compensating or stuck answers when it is finished. A child
    /// past its pivot (a planned child whose plan had one) cannot be undone: the undo
    /// fails, and the parent's compensation with it (the parent is stuck, for an
    /// operator), rather than undo half of it.
    pub(crate) fn undo_as_child(&mut self, by: agentsaga_core::MessageId) -> Result<()> {
        if let Some(link) = &mut self.inst.parent {
            link.compensation = Some(by);
        }
        // Rewinding: given up, the child undoes everything, and answers once undone.
        self.abandon_rewind("its parent turned back");
        match self.inst.state {
            SagaState::Completed if self.past_pivot() => self.answer_parent(),
            SagaState::Completed => self.begin_compensation(
                SagaEvent::Undo,
                "its parent turned back: undone as a whole".into(),
            ),
            SagaState::Running if !self.past_pivot() => self.begin_compensation(
                SagaEvent::Abort,
                "its parent turned back while it ran".into(),
            ),
            SagaState::Compensated | SagaState::Aborted => self.answer_parent(),
            // Running past its pivot (its parent's step is a pivot, never undone),
            // compensating or stuck: it answers once it is finished.
            _ => self.ignore(format!(
                "undo asked of a {} child: answered once it is finished",
                self.inst.state
            )),
        }
    }

    /// Once finished, a child answers its parent: its outcome to the parent's command
    /// (completed: its data; compensated or aborted: the step fails), or, once undone
    /// at the parent's request, to the parent's compensation.
    pub(crate) fn answer_parent(&mut self) -> Result<()> {
        let usage = self.inst.usage;
        let Some(link) = &self.inst.parent else {
            return Ok(());
        };
        let what = format!("the child saga `{}` ({})", self.inst.name, self.inst.id);
        let why = self.inst.error.clone().unwrap_or_default();
        let (causation, outcome) = match (link.compensation, self.inst.state) {
            (Some(undo), SagaState::Compensated) => (undo, StepOutcome::Ok(Value::Null)),
            (Some(undo), SagaState::Aborted) => (
                undo,
                StepOutcome::Fatal(format!(
                    "{what} was aborted past its pivot: what it did stays done ({why})"
                )),
            ),
            (Some(undo), SagaState::Completed) => (
                undo,
                StepOutcome::Fatal(format!(
                    "{what} completed past its pivot: it cannot be undone"
                )),
            ),
            (None, SagaState::Completed) => (link.command, StepOutcome::Ok(self.inst.data.clone())),
            (None, SagaState::Compensated) => (
                link.command,
                StepOutcome::Fatal(format!("{what} was compensated: {why}")),
            ),
            (None, SagaState::Aborted) => (
                link.command,
                StepOutcome::Fatal(format!("{what} was aborted: {why}")),
            ),
            _ => return Ok(()),
        };
        let answer = protocol::child_answer(
            &link.reply_to,
            link.saga,
            link.step,
            &link.step_name,
            causation,
            &outcome,
        )?;
        // What the child used counts against its parent's budget too: each answer
        // carries the child's whole usage so far, and the parent's step takes what it
        // had not seen (an answer lost or ignored loses nothing).
        self.fx.send.push(protocol::with_usage(answer, &usage));
        Ok(())
    }
}
