//! Agents: the workers that carry out saga steps, effectively once.

use agentsaga_core::{Conn, Envelope, MessageId, Tx, header};
use agentsaga_saga::{SagaId, Usage, protocol};
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
    /// The outside world said "too many requests" (an HTTP 429), with its
    /// `Retry-After` if it gave one. No step retry is spent: for a rate-limited
    /// destination ([`RuntimeBuilder::rate_limit`](crate::RuntimeBuilder::rate_limit))
    /// the whole destination pauses that long, in every process, and the call runs
    /// again at its next slot; elsewhere the message is delivered again after it.
    #[error("rate limited{}", .retry_after.map(|d| format!(", retry after {d:?}")).unwrap_or_default())]
    RateLimited {
        /// How long the outside world asked to wait.
        retry_after: Option<std::time::Duration>,
    },
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

    /// "Too many requests", to try again after `retry_after` (the provider's
    /// `Retry-After`; `None`: a second).
    pub fn rate_limited(retry_after: Option<std::time::Duration>) -> Self {
        StepError::RateLimited { retry_after }
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

/// What an agent sees of the message it works on: its saga, its step, and the
/// idempotency key to pass to the outside world. [`CallingAgent::call`] gets it alone
/// (no transaction); [`AgentContext`] offers it too, beside the transaction.
pub struct CallContext<'a> {
    pub(crate) envelope: &'a Envelope,
    usage: Option<&'a Meter>,
}

/// What a delivery's work reported it used, across its `call` and its `record`.
pub(crate) type Meter = std::sync::Mutex<Usage>;

impl<'a> CallContext<'a> {
    pub(crate) fn new(envelope: &'a Envelope) -> Self {
        Self {
            envelope,
            usage: None,
        }
    }

    /// A context whose [`report_usage`](Self::report_usage) adds to `meter`.
    pub(crate) fn metered(envelope: &'a Envelope, meter: &'a Meter) -> Self {
        Self {
            envelope,
            usage: Some(meter),
        }
    }

    /// Reports what this work used (a model's tokens, a call's cost, more outside
    /// calls): it travels with the reply, and counts against the saga's budget
    /// ([`SagaBuilder::budget`](agentsaga_saga::SagaBuilder::budget)). Reports add up;
    /// report what a failed call used too. A [`CallingAgent`] counts one outside call
    /// per [`call`](CallingAgent::call) by itself.
    pub fn report_usage(&self, usage: Usage) {
        if let Some(meter) = self.usage {
            let mut total = meter
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *total += usage;
        }
    }

    /// The key to pass to every outside API this work calls (an `Idempotency-Key`
    /// header, a request id), so that the outside world can recognise a repeat.
    ///
    /// Outside calls are at-least-once: a command is delivered again after a crash, a
    /// lost answer or a step timeout, and the call runs again. The key stays the same
    /// across all of those: every delivery of one message, every re-send of one saga
    /// step (after a timeout, or a retry after a retryable error), before and after a
    /// process restart. It differs between two steps, between two sagas, and between a
    /// step and its compensation. For a saga step it reads
    /// `agentsaga:<saga id>:<step index>:command` (`…:compensate` for the undo); for a
    /// message not sent by a saga it is the message id. Append
    /// [`message_id`](Self::message_id) (new for every re-send of a step) if an API
    /// must see each retry as new.
    pub fn idempotency_key(&self) -> String {
        self.envelope
            .header(header::IDEMPOTENCY_KEY)
            .map_or_else(|| self.envelope.id.to_string(), str::to_owned)
    }

    /// The saga this command belongs to, if it came from one.
    pub fn saga_id(&self) -> Option<SagaId> {
        self.envelope
            .header(header::SAGA_ID)
            .and_then(|s| s.parse().ok())
    }

    /// The step's name, if the command came from a saga.
    pub fn step_name(&self) -> Option<&str> {
        self.envelope.header(protocol::STEP_NAME)
    }

    /// Is this a compensation (an undo) rather than a step's command?
    pub fn is_compensation(&self) -> bool {
        protocol::is_compensation(self.envelope)
    }

    /// The message id (the inbox's dedupe key). A saga step re-sent after a timeout or
    /// a retryable error is a new message; see
    /// [`idempotency_key`](Self::idempotency_key) for what stays the same.
    pub fn message_id(&self) -> MessageId {
        self.envelope.id
    }

    /// How many times this message's delivery was attempted, this one included.
    pub fn delivery_attempt(&self) -> u32 {
        self.envelope.attempts
    }

    /// How long this work may take once started (the saga step's `timeout`), if
    /// bounded: past it the runtime cancels the work.
    pub fn timeout(&self) -> Option<std::time::Duration> {
        self.envelope
            .header(header::TIMEOUT_MS)
            .and_then(|t| t.parse().ok())
            .map(std::time::Duration::from_millis)
    }

    /// The whole envelope.
    pub fn envelope(&self) -> &Envelope {
        self.envelope
    }
}

/// What an agent's handler sees: the transaction its effects go through (the same
/// one that records the message in the inbox and enqueues the reply), and, through
/// `Deref`, everything a [`CallContext`] tells about the message.
pub struct AgentContext<'a> {
    pub(crate) tx: &'a mut Tx,
    pub(crate) call: CallContext<'a>,
}

impl<'a> std::ops::Deref for AgentContext<'a> {
    type Target = CallContext<'a>;

    fn deref(&self) -> &CallContext<'a> {
        &self.call
    }
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
}

/// An agent that only writes to the database: a destination, a typed command and
/// reply, and a handler whose database effects go through the transaction that also
/// records the message in the inbox and enqueues the reply — so a redelivered
/// duplicate is recognised and skipped, and its reply is never sent twice.
///
/// The handler runs inside that transaction: on SQLite it holds the single writer, on
/// PostgreSQL a pooled connection, for as long as it runs. An agent that waits on the
/// outside world (an LLM, an API, a person) is a [`CallingAgent`] instead. The saga
/// tables (`saga_instances`, `saga_steps`) are the runtime's: on SQLite the hop read
/// its saga before the handler runs, to apply the reply without a read of its own, so
/// a handler that wrote them would have its write overwritten.
///
/// Compensations are commands too: give the command type a variant for the undo (the
/// context's [`is_compensation`](CallContext::is_compensation) tells them apart), and
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

/// An agent whose work waits on the outside world: an LLM, a search or calendar API, a
/// payment provider. Its work has two parts:
///
/// 1. [`call`](Self::call) talks to the outside world with **no database transaction
///    or connection held**, for as long as it takes (the relay renews the message's
///    lease meanwhile; the step's `timeout`, if any, is the bound). Outside calls are
///    at-least-once: pass [`CallContext::idempotency_key`] to every API that takes one.
/// 2. [`record`](Self::record) then writes the call's result to the database in one
///    short transaction, the same one that records the message in the inbox and
///    enqueues the reply: database effects stay effectively-once.
///
/// A message already recorded in the inbox is skipped before `call` runs; a duplicate
/// that races past that check runs `call` again, and its `record` is rolled back.
///
/// ```
/// use agentsaga_runtime::{AgentContext, CallContext, CallingAgent, StepError};
///
/// struct Summarise;
///
/// #[async_trait::async_trait]
/// impl CallingAgent for Summarise {
///     type Command = String;
///     type Output = String;
///     type Reply = String;
///     fn destination(&self) -> &str { "summaries" }
///     async fn call(&self, ctx: &CallContext<'_>, text: &String) -> Result<String, StepError> {
///         // POST to the model with `Idempotency-Key: {ctx.idempotency_key()}` ...
///         Ok(format!("{} words", text.split_whitespace().count()))
///     }
///     async fn record(&self, _ctx: &mut AgentContext<'_>, _text: String, summary: String)
///         -> Result<String, StepError> {
///         // ... INSERT the summary through ctx.conn() ...
///         Ok(summary)
///     }
/// }
/// ```
#[async_trait::async_trait]
pub trait CallingAgent: Send + Sync + 'static {
    /// The command payload, decoded from JSON (a payload that does not decode is
    /// dead-lettered with the decode error).
    type Command: DeserializeOwned + Send + Sync;
    /// What [`call`](Self::call) brings back for [`record`](Self::record).
    type Output: Send;
    /// The reply payload, folded into the saga data by the step's `on_reply`.
    type Reply: Serialize + Send;

    /// The destination this agent consumes.
    fn destination(&self) -> &str;

    /// The tokens `command`'s call will use, as best known beforehand: what a
    /// destination's tokens-per-minute limit reserves for it
    /// ([`RuntimeBuilder::rate_limit`](crate::RuntimeBuilder::rate_limit)); what the
    /// call reports it used reconciles the difference. Default 0: no estimate, and the
    /// call reserves the running average of what the destination's calls reported
    /// (while none has, the first goes alone and the others wait for its report).
    fn estimate_tokens(&self, _command: &Self::Command) -> u64 {
        0
    }

    /// The outside part of the work, with no transaction held. Runs at least once per
    /// command (again after a crash or a redelivery), always with the same
    /// idempotency key.
    ///
    /// # Errors
    /// [`StepError`]: retryable (the step is retried per its policy), fatal (the saga
    /// compensates), or infrastructure (the message is delivered again later).
    async fn call(
        &self,
        ctx: &CallContext<'_>,
        command: &Self::Command,
    ) -> Result<Self::Output, StepError>;

    /// The database part: effects through `ctx.conn()`, in the transaction that also
    /// records the inbox entry and the reply. Keep it short: it holds the database. An
    /// `Err` rolls the effects back.
    ///
    /// # Errors
    /// As [`call`](Self::call).
    async fn record(
        &self,
        ctx: &mut AgentContext<'_>,
        command: Self::Command,
        output: Self::Output,
    ) -> Result<Self::Reply, StepError>;
}
