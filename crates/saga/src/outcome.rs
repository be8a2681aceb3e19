//! The wire protocol between the orchestrator and the agents: commands carry saga
//! headers and a `reply_to`; agents answer with a [`StepOutcome`].

use agentsaga_core::{Envelope, Message, header};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Header: the step's index in its saga.
pub const STEP: &str = "step";
/// Header: the step's name (for people reading the outbox).
pub const STEP_NAME: &str = "step_name";
/// `kind` of a step's command.
pub const KIND_COMMAND: &str = "command";
/// `kind` of a compensation command.
pub const KIND_COMPENSATE: &str = "compensate";
/// `kind` of an agent's answer.
pub const KIND_REPLY: &str = "reply";
/// `kind` of a step's timeout timer.
pub const KIND_TIMEOUT: &str = "timeout";
/// `kind` of a step's schedule-to-start timer.
pub const KIND_START_TIMEOUT: &str = "start_timeout";
/// `kind` of the saga's deadline timer.
pub const KIND_DEADLINE: &str = "deadline";

/// An agent's answer to a command or a compensation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepOutcome {
    /// Done; the value is folded into the saga data.
    Ok(Value),
    /// Failed, may succeed if tried again: retried per the step's policy.
    Retryable(String),
    /// Failed for good: the saga compensates (or, after its pivot, is stuck).
    Fatal(String),
}

impl StepOutcome {
    /// The error text, if this is a failure.
    pub fn error(&self) -> Option<&str> {
        match self {
            StepOutcome::Ok(_) => None,
            StepOutcome::Retryable(e) | StepOutcome::Fatal(e) => Some(e),
        }
    }
}

/// The notice that the consumer of `command` gave up on it past its `timeout_ms`:
/// a `timeout` message to its `reply_to`, telling the orchestrator that the step's
/// outcome is unknown (it applies the step's timeout rules). `None` without a
/// `reply_to`.
pub fn timed_out(command: &Envelope) -> Option<Message> {
    let to = command.header(header::REPLY_TO)?;
    let mut msg = Message::to(to)
        .header(header::KIND, KIND_TIMEOUT)
        .header(header::CAUSATION_ID, command.id.to_string());
    for name in [header::SAGA_ID, STEP, STEP_NAME] {
        if let Some(v) = command.header(name) {
            msg = msg.header(name, v);
        }
    }
    Some(msg)
}

/// The reply to `command`, addressed to its `reply_to`, carrying its saga headers.
/// `None` if the command has no `reply_to` (it was not sent by a saga).
///
/// # Errors
/// [`agentsaga_core::Error::Json`] if the outcome cannot be serialized.
pub fn reply(command: &Envelope, outcome: &StepOutcome) -> agentsaga_core::Result<Option<Message>> {
    let Some(to) = command.header(header::REPLY_TO) else {
        return Ok(None);
    };
    let mut msg = Message::to(to)
        .header(header::KIND, KIND_REPLY)
        .header(header::CAUSATION_ID, command.id.to_string())
        .json(outcome)?;
    // The trace context is not copied: the reply's own enqueue captures the agent's
    // span, so the reply hangs under the handling that produced it.
    for name in [header::SAGA_ID, STEP, STEP_NAME] {
        if let Some(v) = command.header(name) {
            msg = msg.header(name, v);
        }
    }
    Ok(Some(msg))
}
