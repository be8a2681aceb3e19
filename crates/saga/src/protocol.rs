//! The saga protocol: every message the orchestrator sends or receives, typed.
//!
//! The orchestrator of saga version `saga.<name>.v<version>` sends each step's
//! command and compensation to an agent, and durable timers to itself; it receives
//! the agents' answers, those timers, and the relay's dead-letter notices. What it
//! receives is parsed once, into an [`Inbound`]; what it sends is built here.
//!
//! # Headers
//!
//! The saga's own: [`STEP`] (the step's index) and [`STEP_NAME`]. From
//! [`agentsaga_core::header`], shared with the outbox and the relay:
//!
//! - [`header::SAGA_ID`]: on every saga message;
//! - [`header::KIND`]: one of this module's `KIND_*` values, or core's
//!   [`header::KIND_DELIVERY_FAILED`] on the relay's notice of a dead-lettered
//!   command (payload: [`DeliveryFailed`](agentsaga_core::DeliveryFailed));
//! - [`header::REPLY_TO`]: on commands and compensations, the orchestrator's
//!   destination;
//! - [`header::CAUSATION_ID`]: on answers and timers, the command they concern;
//! - [`header::IDEMPOTENCY_KEY`]: on commands and compensations
//!   (`agentsaga:<saga id>:<step>:command|compensate`);
//! - [`header::TIMEOUT_MS`]: on a command whose step has a `timeout`.
//!
//! # Messages
//!
//! | `kind` | from → to | headers besides `saga_id`, `kind` | payload |
//! |---|---|---|---|
//! | `command` | orchestrator → agent | `step`, `step_name`, `reply_to`, `idempotency_key`, `timeout_ms`? | the step's command |
//! | `compensate` | orchestrator → agent | `step`, `step_name`, `reply_to`, `idempotency_key` | the compensation recorded at the step's dispatch, or built at its own from the step's reply |
//! | `build_compensation` | orchestrator without the definition → one with it | `step`, `step_name` | `null` |
//! | `reply` | agent → orchestrator ([`reply`]) | `step`, `step_name`, `causation_id` | a [`StepOutcome`] |
//! | `timeout` | agent → orchestrator ([`timed_out`]) | `step`, `step_name`, `causation_id` | `null` |
//! | `start_timeout` | orchestrator → itself, delayed | `step`, `step_name`, `causation_id` | `null` |
//! | `deadline` | orchestrator → itself, delayed | — | `null` |
//! | `timeout` (a wait's) | orchestrator → itself, delayed | `step`, `step_name`, `causation_id` (the wait's id) | `null` |
//! | `signal` | `Engine::signal` (runtime, CLI) → orchestrator | `signal` (the wait's name) | `null`: the outcome is in `saga_signals` |
//! | `delivery_failed` | relay → orchestrator | the dead letter's own, `causation_id` | [`DeliveryFailed`](agentsaga_core::DeliveryFailed) |
//!
//! A step's command and its compensation share the ordering key
//! `<saga id>:<step>`, so that an undo never overtakes its do.
//!
//! `build_compensation` is how a process that lacks the saga's definition (the CLI
//! aborting a saga) dispatches a compensation built from its step's reply: it asks the
//! saga's orchestrator destination, consumed only by processes that have the
//! definition, to build the compensation and send it.

use std::time::Duration;

use agentsaga_core::{Envelope, Message, MessageId, header};
use serde_json::Value;

use crate::{Result, SagaId};

mod inbound;
#[cfg(test)]
mod tests;
mod words;

pub use inbound::{Inbound, saga_id, step_of};
pub use words::*;

// ----- sent by the orchestrator ----------------------------------------------------

/// What the orchestrator sends an agent, as read back from the envelope (a dead
/// letter, a delivery).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outbound {
    /// Step `step`'s command.
    Command {
        /// The step's index.
        step: usize,
    },
    /// Step `step`'s compensation.
    Compensation {
        /// The step's index.
        step: usize,
    },
}

impl Outbound {
    /// `None`: not a saga's command or compensation (or without a step that parses).
    pub fn parse(env: &Envelope) -> Option<Outbound> {
        let step = step_of(env)?;
        match env.header(header::KIND)? {
            KIND_COMMAND => Some(Outbound::Command { step }),
            KIND_COMPENSATE => Some(Outbound::Compensation { step }),
            _ => None,
        }
    }
}

/// Is `env` a saga's compensation (an undo) rather than a step's command?
pub fn is_compensation(env: &Envelope) -> bool {
    env.header(header::KIND) == Some(KIND_COMPENSATE)
}

/// The ordering key shared by a step's command and its compensation, so that an undo
/// never overtakes its do.
pub(crate) fn step_key(saga: SagaId, step: usize) -> String {
    format!("{saga}:{step}")
}

/// The idempotency key of step `step`'s command (`kind` = `command`) or compensation
/// (`compensate`): the same for every delivery, retry and re-send of it.
pub(crate) fn idempotency_key(saga: SagaId, step: usize, kind: &str) -> String {
    format!("agentsaga:{saga}:{step}:{kind}")
}

/// One step of one saga, as the messages about it address it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepAddress<'a> {
    pub(crate) saga: SagaId,
    pub(crate) step: usize,
    pub(crate) name: &'a str,
    /// The orchestrator's destination: where answers and timers go.
    pub(crate) orchestrator: &'a str,
}

impl StepAddress<'_> {
    fn headers(&self, msg: Message, kind: &str) -> Message {
        let msg = msg
            .header(header::SAGA_ID, self.saga.to_string())
            .header(STEP, self.step.to_string())
            .header(STEP_NAME, self.name)
            .header(header::KIND, kind);
        if kind == KIND_COMMAND || kind == KIND_COMPENSATE {
            msg.header(
                header::IDEMPOTENCY_KEY,
                idempotency_key(self.saga, self.step, kind),
            )
        } else {
            msg
        }
    }

    /// An agent-bound message of `kind` (command or compensation).
    fn agent_bound(
        &self,
        kind: &str,
        destination: &str,
        payload: &Value,
        delay: Duration,
    ) -> Result<Message> {
        let msg = Message::to(destination)
            .key(step_key(self.saga, self.step))
            .header(header::REPLY_TO, self.orchestrator)
            .json(payload)?
            .delay(delay);
        Ok(self.headers(msg, kind))
    }

    /// The step's command to `destination`, sent after `delay`; `timeout` is how long
    /// the agent may work on it once started.
    pub(crate) fn command(
        &self,
        destination: &str,
        payload: &Value,
        delay: Duration,
        timeout: Option<Duration>,
    ) -> Result<Message> {
        let msg = self.agent_bound(KIND_COMMAND, destination, payload, delay)?;
        Ok(match timeout {
            Some(t) => msg.header(header::TIMEOUT_MS, t.as_millis().to_string()),
            None => msg,
        })
    }

    /// The step's compensation to `destination`, sent after `delay`.
    pub(crate) fn compensation(
        &self,
        destination: &str,
        payload: &Value,
        delay: Duration,
    ) -> Result<Message> {
        self.agent_bound(KIND_COMPENSATE, destination, payload, delay)
    }

    /// The request that the saga's orchestrator build the step's compensation and send
    /// it (the sender lacks the definition).
    pub(crate) fn build_compensation(&self) -> Message {
        self.headers(Message::to(self.orchestrator), KIND_BUILD_COMPENSATION)
    }

    /// The timeout of the step's wait `wait` (its id, the cause a signal answers), due
    /// `after` from now: the same `timeout` an agent sends when it gives up.
    pub(crate) fn wait_timer(&self, wait: MessageId, after: Duration) -> Message {
        self.headers(Message::to(self.orchestrator), KIND_TIMEOUT)
            .header(header::CAUSATION_ID, wait.to_string())
            .delay(after)
    }

    /// The schedule-to-start timer of `command`, due `after` from now.
    pub(crate) fn start_timer(&self, command: MessageId, after: Duration) -> Message {
        self.headers(Message::to(self.orchestrator), KIND_START_TIMEOUT)
            .header(header::CAUSATION_ID, command.to_string())
            .delay(after)
    }
}

/// The wake-up of saga `saga`'s orchestrator once an operator raised its budget.
pub(crate) fn budget_raised(saga: SagaId, orchestrator: &str) -> Message {
    Message::to(orchestrator)
        .header(header::SAGA_ID, saga.to_string())
        .header(header::KIND, KIND_BUDGET_RAISED)
}

/// The wake-up of saga `saga`'s orchestrator once an operator resumed it from a process
/// without its definition: what the pause held back is sent there.
pub(crate) fn resumed(saga: SagaId, orchestrator: &str) -> Message {
    Message::to(orchestrator)
        .header(header::SAGA_ID, saga.to_string())
        .header(header::KIND, KIND_RESUMED)
}

/// Saga `saga`'s deadline timer, due `after` from now.
pub(crate) fn deadline_timer(saga: SagaId, orchestrator: &str, after: Duration) -> Message {
    Message::to(orchestrator)
        .header(header::SAGA_ID, saga.to_string())
        .header(header::KIND, KIND_DEADLINE)
        .delay(after)
}

// ----- sent by agents --------------------------------------------------------------

/// An answer to `command`, addressed to its `reply_to`, with its saga headers.
fn answer(command: &Envelope, kind: &str) -> Option<Message> {
    let to = command.header(header::REPLY_TO)?;
    let mut msg = Message::to(to)
        .header(header::KIND, kind)
        .header(header::CAUSATION_ID, command.id.to_string());
    // The trace context is not copied: the answer's own enqueue captures the agent's
    // span, so the answer hangs under the handling that produced it.
    for name in [header::SAGA_ID, STEP, STEP_NAME] {
        if let Some(v) = command.header(name) {
            msg = msg.header(name, v);
        }
    }
    Some(msg)
}

/// The notice that the consumer of `command` gave up on it past its `timeout_ms`:
/// a `timeout` message to its `reply_to`, telling the orchestrator that the step's
/// outcome is unknown (it applies the step's timeout rules). `None` without a
/// `reply_to`.
pub fn timed_out(command: &Envelope) -> Option<Message> {
    answer(command, KIND_TIMEOUT)
}

/// The reply to `command`, addressed to its `reply_to`, carrying its saga headers.
/// `None` if the command has no `reply_to` (it was not sent by a saga).
///
/// # Errors
/// [`agentsaga_core::Error::Json`] if the outcome cannot be serialized.
pub fn reply(command: &Envelope, outcome: &StepOutcome) -> agentsaga_core::Result<Option<Message>> {
    answer(command, KIND_REPLY)
        .map(|msg| msg.json(outcome))
        .transpose()
}

/// `answer` (a reply) carrying what its work used, in its [`USAGE`] header (none if
/// nothing was used).
pub fn with_usage(answer: Message, usage: &crate::Usage) -> Message {
    if usage.is_zero() {
        return answer;
    }
    let json = serde_json::to_string(usage).expect("a usage serializes");
    answer.header(USAGE, json)
}

/// A child saga's answer (a `reply`) to the parent step that started it: `causation`
/// is the parent's command (the child's outcome) or its compensation (the child is
/// undone), addressed to the parent's orchestrator `reply_to` with the parent's saga
/// headers, as an agent's reply would be.
///
/// # Errors
/// [`agentsaga_core::Error::Json`] if the outcome cannot be serialized.
pub(crate) fn child_answer(
    reply_to: &str,
    parent: SagaId,
    step: usize,
    step_name: &str,
    causation: MessageId,
    outcome: &StepOutcome,
) -> agentsaga_core::Result<Message> {
    Message::to(reply_to)
        .header(header::KIND, KIND_REPLY)
        .header(header::CAUSATION_ID, causation.to_string())
        .header(header::SAGA_ID, parent.to_string())
        .header(STEP, step.to_string())
        .header(STEP_NAME, step_name)
        .json(outcome)
}

/// `msg` as the relay would hand it over on its first delivery, written now: for an
/// answer applied where it is made (`Engine::apply_local`), and for tests that touch
/// no store. (Its `seq` is no row's.)
#[cfg(test)]
pub(crate) fn envelope(msg: &Message) -> Envelope {
    envelope_at(msg, agentsaga_core::clock::system_now_ms())
}

/// [`envelope`], written at `now_ms` (the store's clock).
pub(crate) fn envelope_at(msg: &Message, now_ms: i64) -> Envelope {
    Envelope {
        seq: 1,
        id: msg.id,
        destination: msg.destination.clone(),
        key: msg.key.clone(),
        payload: msg.payload.clone(),
        headers: msg.headers.clone(),
        attempts: 1,
        created_at_ms: now_ms,
    }
}
