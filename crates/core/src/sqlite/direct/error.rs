//! Errors of statements run on the session, as sqlx reports SQLite's.
#![forbid(unsafe_code)] // the parent's `unsafe` stays there

use std::ffi::c_int;

use rusqlite::ffi;

use crate::Error;

/// A database error of a statement run here, as sqlx reports SQLite's: the extended
/// result code as the code.
#[derive(Debug)]
struct DirectError {
    code: c_int,
    message: String,
}

impl std::fmt::Display for DirectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DirectError {}

impl sqlx::error::DatabaseError for DirectError {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(self.code.to_string().into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        use sqlx::error::ErrorKind;
        match self.code {
            ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
                ErrorKind::UniqueViolation
            }
            ffi::SQLITE_CONSTRAINT_FOREIGNKEY => ErrorKind::ForeignKeyViolation,
            ffi::SQLITE_CONSTRAINT_NOTNULL => ErrorKind::NotNullViolation,
            ffi::SQLITE_CONSTRAINT_CHECK => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

/// `rusqlite`'s error as the crate's: SQLite's (the connection reports extended result
/// codes: sqlx turns them on) as sqlx reports it, anything else (a statement that is
/// not one, a wrong count of values) as a protocol error.
pub(super) fn error(e: rusqlite::Error) -> Error {
    match e {
        rusqlite::Error::SqliteFailure(f, message) => {
            Error::Database(sqlx::Error::Database(Box::new(DirectError {
                code: f.extended_code,
                message: message.unwrap_or_else(|| f.to_string()),
            })))
        }
        e => Error::Database(sqlx::Error::Protocol(e.to_string())),
    }
}
