//! `agentsaga-console`: the operator's calls, written once.
//!
//! [`ops::Console`] reads and acts on one store: status, sagas (filtered, paged, stalled
//! ones found), one saga with its data, ledger, usage and budget, abort / retry / skip,
//! a person raising a budget, pausing, resuming or rewinding a saga, signals, starts (with a runtime's definitions), schedules
//! (sagas started on a cron calendar), dead letters and their re-drive or purge. The
//! `agentsaga` CLI prints its documents as tables or `--json`; the admin HTTP API and
//! the web page serve the same documents; the MCP tools call the same functions. No
//! action exists twice.

#[cfg(feature = "http")]
mod api;
mod error;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod ops;
#[cfg(feature = "http")]
mod page;
pub mod time;

pub use error::{Error, Result};
pub use ops::{Action, Console, SagaQuery};
