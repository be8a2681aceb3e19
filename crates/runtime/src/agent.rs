//! Agents: the workers that carry out saga steps, effectively once.

use agentsaga_core::{Conn, Envelope, MessageId, Tx, header};
use agentsaga_saga::{SagaId, outcome};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A step's failure, saying what happens next.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// May succeed if tried again: the orchestrator retries per the step's policy.
    #[error("retryable: {0}")]
    Retryable(String),
    /// Will not succeed: the saga compensates (after its pivot: it is stuck).
    #[error("fatal: {0}")]
    Fatal(String),
    /// The infrastructure failed (the database went away...): the message is not
    /// consumed and will be delivered again, with backoff.
    #[error("infrastructure: {0}")]
    Infrastructure(String),
}

impl StepError {
    /// A retryable error.
    pub fn retryable(e: impl std::fmt::Display) -> Self {
        StepError::Retryable(e.to_string())
    }

    /// A fatal error.
    pub fn fatal(e: impl std::fmt::Display) -> Self {
        StepError::Fatal(e.to_string())
    }
}

impl From<agentsaga_core::Error> for StepError {
    fn from(e: agentsaga_core::Error) -> Self {
        StepError::Infrastructure(e.to_string())
    }
}

impl From<agentsaga_core::sqlx::Error> for StepError {
    fn from(e: agentsaga_core::sqlx::Error) -> Self {
        StepError::Infrastructure(e.to_string())
    }
}

/// `.fatal()` / `.retryable()` on any `Result`, to say what an error means.
pub trait ResultExt<T> {
    /// Maps the error to [`StepError::Fatal`].
    ///
    /// # Errors
    /// The mapped error.
    fn fatal(self) -> Result<T, StepError>;
    /// Maps the error to [`StepError::Retryable`].
    ///
    /// # Errors
    /// The mapped error.
    fn retryable(self) -> Result<T, StepError>;
}

impl<T, E: std::fmt::Display> ResultExt<T> for Result<T, E> {
    fn fatal(self) -> Result<T, StepError> {
        self.map_err(StepError::fatal)
    }

    fn retryable(self) -> Result<T, StepError> {
        self.map_err(StepError::retryable)
    }
}

/// What an agent's handler sees: the transaction its effects go through (the same
/// one that records the message in the inbox and enqueues the reply), and the
/// message's saga context.
pub struct AgentContext<'a> {
    pub(crate) tx: &'a mut Tx,
    pub(crate) envelope: &'a Envelope,
}

impl AgentContext<'_> {
    /// The connection of the transaction: run your effects through it.
    pub fn conn(&mut self) -> Conn<'_> {
        self.tx.conn()
    }

    /// The transaction itself (to enqueue messages of your own, say).
    pub fn tx(&mut self) -> &mut Tx {
        self.tx
    }

    /// The saga this command belongs to, if it came from one.
    pub fn saga_id(&self) -> Option<SagaId> {
        self.envelope
            .header(header::SAGA_ID)
            .and_then(|s| s.parse().ok())
    }

    /// Is this a compensation (an undo) rather than a step's command?
    pub fn is_compensation(&self) -> bool {
        self.envelope.header(header::KIND) == Some(outcome::KIND_COMPENSATE)
    }

    /// The message id (the inbox's dedupe key).
    pub fn message_id(&self) -> MessageId {
        self.envelope.id
    }

    /// How many times delivery was attempted, this one included.
    pub fn delivery_attempt(&self) -> u32 {
        self.envelope.attempts
    }

    /// The whole envelope.
    pub fn envelope(&self) -> &Envelope {
        self.envelope
    }
}

/// An agent: a destination, a typed command and reply, and a handler whose database
/// effects go through the transaction that also records the message in the inbox and
/// enqueues the reply — so a redelivered duplicate is recognised and skipped, and its
/// reply is never sent twice.
///
/// Compensations are commands too: give the command type a variant for the undo (the
/// context's [`is_compensation`](AgentContext::is_compensation) tells them apart), and
/// treat "nothing to undo" as success.
#[async_trait::async_trait]
pub trait Agent: Send + Sync + 'static {
    /// The command payload, decoded from JSON. A payload that does not decode is
    /// dead-lettered with the decode error, and its saga compensates.
    type Command: DeserializeOwned + Send;
    /// The reply payload, folded into the saga data by the step's `on_reply`.
    type Reply: Serialize + Send;

    /// The destination this agent consumes.
    fn destination(&self) -> &str;

    /// Carries out `command`. Effects go through `ctx.conn()`; an `Err` rolls them back.
    ///
    /// # Errors
    /// [`StepError`]: retryable, fatal, or infrastructure (redeliver later).
    async fn handle(
        &self,
        ctx: &mut AgentContext<'_>,
        command: Self::Command,
    ) -> Result<Self::Reply, StepError>;
}
