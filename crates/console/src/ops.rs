//! The operator's calls and the documents they answer with: the one implementation
//! behind `agentsaga … --json`, the admin HTTP API (`/api/v1`), the web page and the
//! MCP tools. Each call reads or acts in one transaction; an action answers with the
//! saga (or message) as it now stands.
//!
//! One file a concept: [`status`](Console::status) (`status.rs`), the sagas
//! (`sagas.rs`) and what they spent, in words (`spending.rs`), their rewinds
//! (`rewinds.rs`), the actions on them, budget raises, pauses, rewinds and signals
//! (`actions.rs`), starts (`starts.rs`), schedules
//! (`schedules.rs`), dead letters (`dead.rs`), remote destinations with the broker's
//! figures (`remote.rs`) and where those come from (`broker.rs`); the error is the
//! crate's (`error.rs`).

use std::time::Duration;

use agentsaga_core::{MessageId, Store};
use agentsaga_saga::{Engine, SagaDefinition, SagaId, SagaState};
use serde_json::Value;

mod actions;
mod broker;
mod dead;
mod remote;
mod rewinds;
mod sagas;
mod schedules;
mod spending;
mod starts;
mod status;

pub use crate::error::{Error, Result};
pub use actions::{Action, SignalDoc};
pub use broker::{BrokerConsumer, RemoteSource};
pub use dead::{DeadDoc, DeadList, PurgeDoc, RedriveAllDoc, RedriveDoc, Refusal};
pub use remote::{REMOTE_TIMEOUT, RemoteDoc, RemoteList};
pub use rewinds::{RewindDoc, UndoneDoc};
pub use sagas::{PausedDoc, SagaDoc, SagaPage, SagaQuery, ShowDoc, StepDoc};
pub use schedules::{ScheduleDoc, ScheduleList};
pub use spending::{budget_text, raise_command, usage_text, waiting_text};
pub use starts::SetAsideDoc;
pub use status::{OutboxDoc, StatusDoc};

/// Every saga state, in lifecycle order: the keys of `sagas` in [`StatusDoc`].
pub const SAGA_STATES: [SagaState; 6] = [
    SagaState::Running,
    SagaState::Compensating,
    SagaState::Stuck,
    SagaState::Completed,
    SagaState::Compensated,
    SagaState::Aborted,
];

/// How long a running saga may make no progress before it counts as stalled, unless
/// configured otherwise ([`Console::stalled_after`]).
pub const DEFAULT_STALLED_AFTER: Duration = Duration::from_secs(15 * 60);

/// The most sagas or dead letters one page or list holds.
pub const MAX_PAGE: u32 = 1000;

/// The most bytes of payloads, headers and errors one page of dead letters holds (but
/// for its first dead letter, bounded by the largest message the store takes): 4 MiB.
/// A page cut short says where the next one starts (`next_before`).
pub const MAX_PAGE_BYTES: usize = 4 << 20;

/// The operator's calls on one store.
#[derive(Clone, Debug)]
pub struct Console {
    store: Store,
    engine: Engine,
    stalled_after: Duration,
    /// Where the broker's figures come from (`broker.rs`), if anywhere.
    remote: Option<broker::Source>,
}

impl Console {
    /// The calls on `store`, with no saga definitions: everything but retrying a step
    /// after the pivot and starting sagas works from the database alone.
    pub fn new(store: Store) -> Self {
        Self {
            store,
            engine: Engine::new(Vec::<SagaDefinition>::new()).expect("no definitions"),
            stalled_after: DEFAULT_STALLED_AFTER,
            remote: None,
        }
    }

    /// The calls with `engine`'s definitions (a runtime's): its sagas can also be
    /// started, and retried past their pivot.
    #[must_use]
    pub fn with_engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }

    /// How long a running saga may make no progress before it counts as stalled
    /// (default 15 minutes).
    #[must_use]
    pub fn stalled_after(mut self, threshold: Duration) -> Self {
        self.stalled_after = threshold;
        self
    }

    /// The no-progress threshold of stalled sagas.
    pub fn stalled_threshold(&self) -> Duration {
        self.stalled_after
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The saga names this console can start (those of its engine).
    pub fn startable(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .engine
            .definitions()
            .map(|d| d.name().to_owned())
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

/// A saga id as an operator typed it.
///
/// # Errors
/// [`Error::Invalid`] naming the text, for anything but a UUID.
pub fn parse_saga_id(text: &str) -> Result<SagaId> {
    text.parse()
        .map_err(|e| Error::Invalid(format!("malformed saga id `{text}`: not a UUID ({e})")))
}

/// A message id as an operator typed it.
///
/// # Errors
/// [`Error::Invalid`] naming the text, for anything but a UUID.
pub fn parse_message_id(text: &str) -> Result<MessageId> {
    text.parse()
        .map_err(|e| Error::Invalid(format!("malformed message id `{text}`: not a UUID ({e})")))
}

/// A JSON text stored in the database as a JSON value (or, if it does not parse, as
/// the string it is).
pub fn json_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}
