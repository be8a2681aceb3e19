//! The errors of `agentsaga-relay`.

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can stop a relay from starting.
///
/// Once started, a relay does not fail: database errors are logged and retried with
/// backoff, and delivery failures are retries or dead letters, never errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The outbox store failed.
    #[error(transparent)]
    Store(#[from] agentsaga_core::Error),

    /// The relay's actors (the claimer or its delivery pool) could not be spawned.
    #[error("cannot start the relay's actors: {0}")]
    Spawn(String),

    /// The configuration cannot work, e.g. zero workers or no destinations.
    #[error("invalid relay configuration: {0}")]
    Config(String),
}
