//! The errors of `agentsaga-saga`.

use crate::{SagaEvent, SagaId, SagaState};

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong defining, starting or advancing a saga.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No saga of this name is registered.
    #[error("no saga named `{0}` is registered")]
    UnknownSaga(String),

    /// The saga instance was made by a definition version this process does not have.
    /// It is left untouched for a process that has it.
    #[error("saga `{name}` version {version} is not registered in this process")]
    VersionNotRegistered {
        /// Saga name.
        name: String,
        /// The instance's version.
        version: i32,
    },

    /// Two definitions with the same name and version, or an invalid definition.
    #[error("invalid saga definition: {0}")]
    InvalidDefinition(String),

    /// No saga instance with this id.
    #[error("no saga with id {0}")]
    NotFound(SagaId),

    /// An operator action that the saga's state does not allow.
    #[error("cannot {action} saga {id}: it is {state}{why}")]
    WrongState {
        /// The saga.
        id: SagaId,
        /// What was asked.
        action: &'static str,
        /// Its state.
        state: SagaState,
        /// More detail, starting with ", " or empty.
        why: String,
    },

    /// `try_start`: the saga name has as many sagas in flight as its admission bound
    /// (or earlier starts wait). Nothing was written; try again later, or use a start
    /// that waits.
    #[error("saga `{name}` is busy: {in_flight} in flight, its bound is {bound}")]
    Busy {
        /// Saga name.
        name: String,
        /// Sagas of that name in flight.
        in_flight: u64,
        /// Its admission bound.
        bound: usize,
    },

    /// A start that waited for room (in `saga_starts`) could not be started when its
    /// turn came (its data no longer fits the saga's input after a deploy, its first
    /// command is too large...): it was set aside with this reason, and the starts
    /// behind it went on. `agentsaga starts list` shows it; `agentsaga starts remove`
    /// deletes it.
    #[error(
        "the waiting start {id} of saga `{name}` could not be started and was set aside: {reason}"
    )]
    StartSetAside {
        /// The id the start was given.
        id: SagaId,
        /// Saga name.
        name: String,
        /// Why it could not start.
        reason: String,
    },

    /// A signal the saga cannot take: it is finished, or it never waits for that name.
    /// Nothing was written.
    #[error("signal `{name}` for saga {saga} refused: {reason}")]
    SignalRefused {
        /// The saga.
        saga: SagaId,
        /// The signal's name.
        name: String,
        /// Why.
        reason: String,
    },

    /// An idempotency key a start cannot use. Nothing was written.
    #[error("invalid saga key `{key}`: {reason}")]
    InvalidKey {
        /// The key (at most its first 64 characters).
        key: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A plan (made at run time) that breaks the rules: no way to undo a step before
    /// the pivot, an unknown destination, two steps with one name, JSON that is not a
    /// plan... Nothing of it was written or run.
    #[error("invalid plan: {0}")]
    InvalidPlan(String),

    /// A schedule that cannot be stored: a name, cron expression, time zone, template
    /// or bound that is wrong, or a saga this process does not have. Nothing was
    /// written.
    #[error("invalid schedule `{name}`: {reason}")]
    InvalidSchedule {
        /// The schedule's name (at most its first 64 characters).
        name: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A schedule of this name exists already (create); nothing was written.
    #[error("a schedule named `{0}` exists already")]
    ScheduleExists(String),

    /// No schedule of this name.
    #[error("no schedule named `{0}`")]
    NoSchedule(String),

    /// An event that the saga lifecycle's transition table does not allow in the
    /// saga's state: the engine's bug, or a row changed behind its back. Nothing of
    /// the transaction that met it may stay: roll it back.
    #[error("no transition from {from} on {event:?}: the lifecycle table does not allow it")]
    IllegalTransition {
        /// The saga's state.
        from: SagaState,
        /// What happened.
        event: SagaEvent,
    },

    /// A message for the orchestrator lacks what it needs (headers, payload).
    #[error("malformed saga message: {0}")]
    Malformed(String),

    /// The saga data could not be encoded or decoded.
    #[error("saga data: {0}")]
    Data(#[from] serde_json::Error),

    /// A row of `saga_instances` / `saga_steps` is not what this binary wrote.
    #[error("corrupt saga row: {0}")]
    Corrupt(String),

    /// The store failed.
    #[error(transparent)]
    Store(#[from] agentsaga_core::Error),
}
