//! What an orchestrator receives, parsed once: [`Inbound`].

use agentsaga_core::{DeliveryFailed, Envelope, MessageId, header};

use super::words::*;
use crate::{Error, Result, SagaId, Usage};

/// A message delivered to an orchestrator, parsed once: what happened to which step.
/// Every one also carries its saga's id ([`saga_id`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Inbound {
    /// An agent answered the command or compensation `causation` of step `step`.
    Reply {
        /// The step's index.
        step: usize,
        /// The command or compensation answered.
        causation: MessageId,
        /// The answer (a payload that is not a [`StepOutcome`] reads as fatal).
        outcome: StepOutcome,
        /// What the work used (its [`USAGE`] header; zero without one, or with one
        /// that does not parse).
        usage: Usage,
        /// Why its [`USAGE`] header does not parse, if it does not: the step it
        /// answers fails, saying so (a late reply is ignored as any late reply is).
        bad_usage: Option<String>,
    },
    /// The agent gave up on `causation` past its timeout: its outcome is unknown.
    Timeout {
        /// The step's index.
        step: usize,
        /// The command or compensation that timed out.
        causation: MessageId,
    },
    /// Step `step`'s schedule-to-start timer: if no agent has taken the command
    /// `causation` by now, it is withdrawn and the step counts as timed out.
    StartTimeout {
        /// The step's index.
        step: usize,
        /// The command it bounds.
        causation: MessageId,
    },
    /// The relay dead-lettered `message`, a command or compensation of step `step`.
    DeliveryFailed {
        /// The step's index.
        step: usize,
        /// The message given up on.
        message: MessageId,
        /// Where it was going.
        destination: String,
        /// Why it was given up on.
        reason: String,
    },
    /// Signal `name` was recorded for the saga (its outcome is in `saga_signals`).
    Signal {
        /// The wait's name.
        name: String,
    },
    /// The saga's deadline timer.
    Deadline,
    /// An operator raised the saga's budget: forward dispatches it held back may go.
    BudgetRaised,
    /// An operator resumed the paused saga (from a process without its definition):
    /// send what the pause held back.
    Resumed,
    /// A process without the saga's definition asks for step `step`'s compensation to
    /// be built (from the step's reply) and sent.
    BuildCompensation {
        /// The step's index.
        step: usize,
        /// The request itself (the ledger names it while it is pending).
        request: MessageId,
    },
}

impl Inbound {
    /// Reads `env`'s `kind` and the headers (and payload) that kind needs. Its saga's
    /// id is read by [`saga_id`].
    ///
    /// # Errors
    /// [`Error::Malformed`] for an unknown `kind`, or a header or payload that the
    /// kind needs and that is missing or does not parse.
    pub fn parse(env: &Envelope) -> Result<Inbound> {
        let kind = env.header(header::KIND).unwrap_or_default();
        let step = || -> Result<usize> {
            env.header(STEP)
                .ok_or_else(|| {
                    Error::Malformed(format!("{kind} message {} has no step header", env.id))
                })?
                .parse()
                .map_err(|e| Error::Malformed(format!("step: {e}")))
        };
        let causation = || -> Result<MessageId> {
            env.header(header::CAUSATION_ID)
                .ok_or_else(|| {
                    Error::Malformed(format!("{kind} message {} has no causation_id", env.id))
                })?
                .parse()
                .map_err(|e| Error::Malformed(format!("causation_id: {e}")))
        };
        let usage = match env.header(USAGE) {
            None => Ok(Usage::default()),
            Some(u) => serde_json::from_str::<Usage>(u)
                .map_err(|e| format!("the reply's usage header `{u}` does not parse: {e}")),
        };
        Ok(match kind {
            KIND_REPLY => Inbound::Reply {
                outcome: StepOutcome::from_payload(&env.payload),
                step: step()?,
                causation: causation()?,
                usage: usage.as_ref().ok().copied().unwrap_or_default(),
                bad_usage: usage.err(),
            },
            KIND_TIMEOUT => Inbound::Timeout {
                step: step()?,
                causation: causation()?,
            },
            KIND_START_TIMEOUT => Inbound::StartTimeout {
                step: step()?,
                causation: causation()?,
            },
            header::KIND_DELIVERY_FAILED => {
                let notice: DeliveryFailed =
                    env.decode().map_err(|e| Error::Malformed(e.to_string()))?;
                Inbound::DeliveryFailed {
                    step: step()?,
                    message: notice.message_id,
                    destination: notice.destination,
                    reason: notice.reason,
                }
            }
            KIND_DEADLINE => Inbound::Deadline,
            KIND_BUDGET_RAISED => Inbound::BudgetRaised,
            KIND_RESUMED => Inbound::Resumed,
            KIND_SIGNAL => Inbound::Signal {
                name: env
                    .header(SIGNAL)
                    .ok_or_else(|| {
                        Error::Malformed(format!("signal message {} has no signal header", env.id))
                    })?
                    .to_owned(),
            },
            KIND_BUILD_COMPENSATION => Inbound::BuildCompensation {
                step: step()?,
                request: env.id,
            },
            other => return Err(Error::Malformed(format!("unknown message kind `{other}`"))),
        })
    }
}

/// The saga a message belongs to (its `saga_id` header).
///
/// # Errors
/// [`Error::Malformed`] if it has none, or one that is not a saga id.
pub fn saga_id(env: &Envelope) -> Result<SagaId> {
    env.header(header::SAGA_ID)
        .ok_or_else(|| Error::Malformed(format!("message {} has no saga_id header", env.id)))?
        .parse()
        .map_err(|e| Error::Malformed(format!("saga_id: {e}")))
}

/// The step a message concerns, if it names one that parses.
pub fn step_of(env: &Envelope) -> Option<usize> {
    env.header(STEP).and_then(|s| s.parse().ok())
}
