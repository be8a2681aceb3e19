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
//!   command (payload: [`DeliveryFailed`]);
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
//! | `delivery_failed` | relay → orchestrator | the dead letter's own, `causation_id` | [`DeliveryFailed`] |
//!
//! A step's command and its compensation share the ordering key
//! `<saga id>:<step>`, so that an undo never overtakes its do.
//!
//! `build_compensation` is how a process that lacks the saga's definition (the CLI
//! aborting a saga) dispatches a compensation built from its step's reply: it asks the
//! saga's orchestrator destination, consumed only by processes that have the
//! definition, to build the compensation and send it.

use std::time::Duration;

use agentsaga_core::{DeliveryFailed, Envelope, Message, MessageId, header};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Error, Result, SagaId};

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

// ----- received by the orchestrator -----------------------------------------------

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
        Ok(match kind {
            KIND_REPLY => Inbound::Reply {
                outcome: StepOutcome::from_payload(&env.payload),
                step: step()?,
                causation: causation()?,
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

/// `msg` as the relay would hand it over on its first delivery, written now: for an
/// answer applied where it is made (`Engine::apply_local`), and for tests that touch
/// no store. (Its `seq` is no row's.)
pub(crate) fn envelope(msg: &Message) -> Envelope {
    Envelope {
        seq: 1,
        id: msg.id,
        destination: msg.destination.clone(),
        key: msg.key.clone(),
        payload: msg.payload.clone(),
        headers: msg.headers.clone(),
        attempts: 1,
        created_at_ms: agentsaga_core::clock::now_ms(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agentsaga_core::{DeliveryFailed, Envelope, header};
    use serde_json::json;

    use super::*;

    fn address(saga: SagaId) -> StepAddress<'static> {
        StepAddress {
            saga,
            step: 2,
            name: "hotel",
            orchestrator: "saga.trip.v1",
        }
    }

    #[test]
    fn commands_and_compensations_carry_the_saga_headers() {
        let saga = SagaId::new();
        let cmd = address(saga)
            .command(
                "hotels",
                &json!({"room": 1}),
                Duration::ZERO,
                Some(Duration::from_secs(2)),
            )
            .unwrap();
        let env = envelope(&cmd);
        assert_eq!(env.destination, "hotels");
        assert_eq!(env.key.as_deref(), Some(format!("{saga}:2").as_str()));
        assert_eq!(env.header(header::REPLY_TO), Some("saga.trip.v1"));
        assert_eq!(env.header(header::KIND), Some(KIND_COMMAND));
        assert_eq!(env.header(STEP), Some("2"));
        assert_eq!(env.header(STEP_NAME), Some("hotel"));
        assert_eq!(env.header(header::TIMEOUT_MS), Some("2000"));
        assert_eq!(
            env.header(header::IDEMPOTENCY_KEY),
            Some(format!("agentsaga:{saga}:2:command").as_str())
        );
        assert_eq!(Outbound::parse(&env), Some(Outbound::Command { step: 2 }));
        assert!(!is_compensation(&env));

        let undo = address(saga)
            .compensation("hotels", &json!("cancel"), Duration::ZERO)
            .unwrap();
        let env = envelope(&undo);
        assert_eq!(env.key, cmd.key.clone(), "same key");
        assert_eq!(env.header(header::TIMEOUT_MS), None);
        assert_eq!(
            env.header(header::IDEMPOTENCY_KEY),
            Some(format!("agentsaga:{saga}:2:compensate").as_str())
        );
        assert_eq!(
            Outbound::parse(&env),
            Some(Outbound::Compensation { step: 2 })
        );
        assert!(is_compensation(&env));
    }

    #[test]
    fn every_inbound_kind_parses() {
        let saga = SagaId::new();
        let cmd = address(saga)
            .command("hotels", &json!(null), Duration::ZERO, None)
            .unwrap();
        let cmd_env = envelope(&cmd);
        let id = cmd.id;

        let ok = StepOutcome::Ok(json!("room 7"));
        let r = envelope(&reply(&cmd_env, &ok).unwrap().unwrap());
        assert_eq!(r.destination, "saga.trip.v1");
        assert_eq!(saga_id(&r).unwrap(), saga);
        assert_eq!(
            Inbound::parse(&r).unwrap(),
            Inbound::Reply {
                step: 2,
                causation: id,
                outcome: ok
            }
        );

        let t = envelope(&timed_out(&cmd_env).unwrap());
        assert_eq!(
            Inbound::parse(&t).unwrap(),
            Inbound::Timeout {
                step: 2,
                causation: id
            }
        );

        let s = envelope(&address(saga).start_timer(id, Duration::from_secs(1)));
        assert_eq!(
            Inbound::parse(&s).unwrap(),
            Inbound::StartTimeout {
                step: 2,
                causation: id
            }
        );

        let d = envelope(
            &DeliveryFailed::notice_for(&cmd_env, "gone")
                .unwrap()
                .unwrap(),
        );
        assert_eq!(
            Inbound::parse(&d).unwrap(),
            Inbound::DeliveryFailed {
                step: 2,
                message: id,
                destination: "hotels".into(),
                reason: "gone".into()
            }
        );

        let dl = envelope(&deadline_timer(
            saga,
            "saga.trip.v1",
            Duration::from_secs(9),
        ));
        assert_eq!(saga_id(&dl).unwrap(), saga);
        assert_eq!(Inbound::parse(&dl).unwrap(), Inbound::Deadline);

        let b = envelope(&address(saga).build_compensation());
        assert_eq!(b.destination, "saga.trip.v1");
        assert_eq!(b.key, None, "not held up behind the step's messages");
        assert_eq!(saga_id(&b).unwrap(), saga);
        assert_eq!(
            Inbound::parse(&b).unwrap(),
            Inbound::BuildCompensation {
                step: 2,
                request: b.id
            }
        );
        assert_eq!(Outbound::parse(&b), None, "not sent to agents");
    }

    #[test]
    fn a_reply_that_is_not_an_outcome_is_fatal() {
        let cmd = envelope(
            &address(SagaId::new())
                .command("hotels", &json!(null), Duration::ZERO, None)
                .unwrap(),
        );
        let mut r = envelope(&reply(&cmd, &StepOutcome::Ok(json!(1))).unwrap().unwrap());
        r.payload = r#"{"nope": 1}"#.into();
        let Inbound::Reply { outcome, .. } = Inbound::parse(&r).unwrap() else {
            panic!("a reply");
        };
        assert!(matches!(outcome, StepOutcome::Fatal(e) if e.contains("not a step outcome")));
    }

    #[test]
    fn malformed_messages_are_refused() {
        let saga = SagaId::new();
        let cmd = envelope(
            &address(saga)
                .command("hotels", &json!(null), Duration::ZERO, None)
                .unwrap(),
        );
        let good = envelope(&reply(&cmd, &StepOutcome::Ok(json!(1))).unwrap().unwrap());
        let without = |name: &str| {
            let mut e = good.clone();
            e.headers.remove(name);
            e
        };
        let with = |name: &str, value: &str| {
            let mut e = good.clone();
            e.headers.insert(name.into(), value.into());
            e
        };
        let malformed = |e: &Envelope, what: &str| match Inbound::parse(e) {
            Err(Error::Malformed(m)) => assert!(m.contains(what), "{m} lacks {what}"),
            other => panic!("{other:?}"),
        };
        malformed(&without(STEP), "no step header");
        malformed(&with(STEP, "two"), "step:");
        malformed(&without(header::CAUSATION_ID), "no causation_id");
        malformed(&with(header::CAUSATION_ID, "x"), "causation_id:");
        malformed(
            &with(header::KIND, "gossip"),
            "unknown message kind `gossip`",
        );
        malformed(&without(header::KIND), "unknown message kind ``");
        let mut notice = with(header::KIND, header::KIND_DELIVERY_FAILED);
        notice.payload = "{}".into();
        assert!(matches!(Inbound::parse(&notice), Err(Error::Malformed(_))));

        assert!(
            matches!(saga_id(&without(header::SAGA_ID)), Err(Error::Malformed(m)) if m.contains("no saga_id"))
        );
        assert!(
            matches!(saga_id(&with(header::SAGA_ID, "7")), Err(Error::Malformed(m)) if m.contains("saga_id:"))
        );
        assert_eq!(step_of(&with(STEP, "two")), None);
        assert_eq!(
            Outbound::parse(&good),
            None,
            "a reply is not sent to agents"
        );
    }
}
