//! The protocol's words: the headers it adds to core's, the `kind`s of its messages,
//! and [`StepOutcome`], an agent's answer.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Header: the step's index in its saga.
pub const STEP: &str = "step";
/// Header: the step's name (for people reading the outbox).
pub const STEP_NAME: &str = "step_name";
/// Header of a child saga's start (a command to `saga.<name>.child`): the depth the
/// child will have (1: its parent is a saga started on its own).
pub const CHILD_DEPTH: &str = "child_depth";
/// Header of a child saga's start: the child steps its parent dispatched before this
/// one (what the fan-out bound counts).
pub const CHILDREN_BEFORE: &str = "children_before";
/// Header of a child saga's start and undo, past a rewind of its parent's step: the
/// step's run (1 after one rewind undid it, 2 after two, ...; absent for the first),
/// so that each run of the step has a child of its own.
pub const CHILD_RUN: &str = "child_run";
/// `kind` of a step's command.
pub const KIND_COMMAND: &str = "command";
/// `kind` of a compensation command.
pub const KIND_COMPENSATE: &str = "compensate";
/// `kind` of an agent's answer.
pub const KIND_REPLY: &str = "reply";
/// `kind` of an agent's notice that it gave up on a command past its `timeout_ms`.
pub const KIND_TIMEOUT: &str = "timeout";
/// `kind` of a step's schedule-to-start timer.
pub const KIND_START_TIMEOUT: &str = "start_timeout";
/// `kind` of the saga's deadline timer.
pub const KIND_DEADLINE: &str = "deadline";
/// `kind` of a request to build and send a step's compensation (from its reply), sent
/// to the saga's orchestrator by a process without the saga's definition.
pub const KIND_BUILD_COMPENSATION: &str = "build_compensation";
/// `kind` of the wake-up a signal sends its saga's orchestrator (the signal itself is
/// in `saga_signals`).
pub const KIND_SIGNAL: &str = "signal";
/// Header: the name of the signal a `signal` message announces.
pub const SIGNAL: &str = "signal";
/// Header of a `reply`: what the work used ([`Usage`](crate::Usage) as JSON, e.g.
/// `{"tokens_in":812,"tokens_out":96,"calls":1}`); absent when nothing was used. A
/// value that does not parse makes the reply unprocessable (the step fails with why).
pub const USAGE: &str = "usage";
/// `kind` of the wake-up an operator's budget raise sends its saga's orchestrator
/// (the new budget is in `saga_instances.budget`).
pub const KIND_BUDGET_RAISED: &str = "budget_raised";
/// The wake-up of a resumed saga's orchestrator.
pub const KIND_RESUMED: &str = "resumed";

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

    /// Decodes a reply's payload; one that is not a `StepOutcome` counts as fatal.
    pub(crate) fn from_payload(payload: &str) -> StepOutcome {
        serde_json::from_str::<StepOutcome>(payload)
            .unwrap_or_else(|e| StepOutcome::Fatal(format!("the reply is not a step outcome: {e}")))
    }
}
