//! The console's error: what an operator's call can answer instead of a document.

/// What an operator's call can answer instead of a document.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No saga, dead letter, saga name or schedule with that id or name.
    #[error("{0}")]
    NotFound(String),
    /// The saga's (or message's) state does not allow it; nothing was changed.
    #[error("{0}")]
    Refused(String),
    /// The request itself is wrong (a filter, a key, a plan, data): nothing was done.
    #[error("{0}")]
    Invalid(String),
    /// The database failed.
    #[error("{0}")]
    Store(String),
}

impl Error {
    /// The error's kind as the admin API and the MCP tools name it: `not_found`,
    /// `refused`, `invalid` or `internal`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::NotFound(_) => "not_found",
            Error::Refused(_) => "refused",
            Error::Invalid(_) => "invalid",
            Error::Store(_) => "internal",
        }
    }
}

/// `Result` with the console's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<agentsaga_core::Error> for Error {
    fn from(e: agentsaga_core::Error) -> Self {
        Error::Store(e.to_string())
    }
}

impl From<agentsaga_saga::Error> for Error {
    fn from(e: agentsaga_saga::Error) -> Self {
        use agentsaga_saga::Error as S;
        match e {
            S::NotFound(_) | S::UnknownSaga(_) | S::NoSchedule(_) => Error::NotFound(e.to_string()),
            S::WrongState { .. } | S::SignalRefused { .. } | S::Busy { .. } => {
                Error::Refused(e.to_string())
            }
            S::InvalidKey { .. }
            | S::InvalidPlan(_)
            | S::InvalidSchedule { .. }
            | S::Data(_)
            | S::Malformed(_) => Error::Invalid(e.to_string()),
            S::ScheduleExists(_) => Error::Refused(e.to_string()),
            S::VersionNotRegistered { .. } | S::StartSetAside { .. } => {
                Error::Refused(e.to_string())
            }
            other => Error::Store(other.to_string()),
        }
    }
}
