//! Where the broker's figures come from: a [`RemoteSource`] that whoever has the link
//! gives the console (`remote.rs` joins its figures with the database's).

use std::fmt;
use std::sync::Arc;

/// What the broker says about one consumer of a destination (a service reading it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConsumer {
    /// The consumer's name (`<service>_<destination>` for agentsaga's receivers).
    pub consumer: String,
    /// The destination it serves.
    pub destination: String,
    /// Published, not yet delivered to it.
    pub pending: u64,
    /// Delivered to it, not yet acknowledged: in the service's hands.
    pub ack_pending: u64,
    /// Of those, delivered more than once.
    pub redelivered: u64,
}

/// Where [`Console::remote`](crate::Console::remote) gets the broker's figures from.
#[async_trait::async_trait]
pub trait RemoteSource: Send + Sync + 'static {
    /// The broker and stream, as the operator knows them (`nats://host:4222, stream
    /// AGENTSAGA`).
    fn describe(&self) -> String;

    /// Destinations listed even when no consumer serves them yet (a runtime's remote
    /// ones and its own): empty unless known.
    fn declared(&self) -> Vec<String> {
        Vec::new()
    }

    /// The consumers to show, or why the broker could not be read.
    async fn consumers(&self) -> std::result::Result<Vec<BrokerConsumer>, String>;
}

/// A [`RemoteSource`] as the console holds it.
#[derive(Clone)]
pub(crate) struct Source(pub(crate) Arc<dyn RemoteSource>);

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RemoteSource")
            .field(&self.0.describe())
            .finish()
    }
}
