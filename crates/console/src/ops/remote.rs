//! `remote`: destinations served by other services over a broker, with the broker's
//! figures (how far behind each service's consumer is) beside this database's rows
//! waiting for them.
//!
//! The console does not speak to the broker itself: whoever has the link (a runtime's
//! `NatsLink`, the CLI's `--nats`) gives it a [`RemoteSource`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::admin::DestinationRows;
use serde::Serialize;

use super::broker::{BrokerConsumer, RemoteSource, Source};
use super::{Console, Error, Result};

/// How long [`Console::remote`] waits for the broker's figures before it says the
/// broker did not answer.
pub const REMOTE_TIMEOUT: Duration = Duration::from_secs(2);

/// One destination and one consumer of it (or none yet).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RemoteDoc {
    /// The destination.
    pub destination: String,
    /// The consumer serving it (`None`: none on the broker, or the broker not read).
    pub consumer: Option<String>,
    /// Published, not yet delivered to the consumer (`None` without one).
    pub pending: Option<u64>,
    /// Delivered to the consumer, not yet acknowledged: in its service's hands.
    pub ack_pending: Option<u64>,
    /// Of those, delivered more than once.
    pub redelivered: Option<u64>,
    /// This database's rows for the destination not yet delivered (to the broker, for
    /// a destination served elsewhere; to the local agent, for one served here).
    pub outbox_pending: u64,
    /// This database's rows for it claimed by a relay.
    pub outbox_in_flight: u64,
    /// Of its pending rows, those waiting because the broker (or the service) could
    /// not be reached: they spend no attempts while they wait.
    pub outbox_unavailable: u64,
    /// Why it could not be reached, as one such row says (`None` when none
    /// waits for that).
    pub unavailable: Option<String>,
}

/// `agentsaga remote --json`, `GET /api/v1/remote`, `remote` in `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RemoteList {
    /// The broker and stream read.
    pub broker: String,
    /// Why the broker's figures are missing (it could not be reached, did not answer
    /// within [`REMOTE_TIMEOUT`], or refused): `None` when they are there.
    pub error: Option<String>,
    /// By destination, then consumer: the declared destinations and every consumer
    /// the source shows.
    pub destinations: Vec<RemoteDoc>,
}

impl Console {
    /// The broker's figures come from `source` ([`remote`](Self::remote), and
    /// `remote` in [`status`](Self::status)).
    #[must_use]
    pub fn with_remote(mut self, source: Arc<dyn RemoteSource>) -> Self {
        self.remote = Some(Source(source));
        self
    }

    /// Whether this console has a broker to read ([`with_remote`](Self::with_remote)).
    pub fn has_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// The remote destinations: per consumer, the broker's figures beside this
    /// database's rows waiting for its destination. A broker that cannot be read (or
    /// does not answer within [`REMOTE_TIMEOUT`]) is said in `error`: the declared
    /// destinations are listed with this database's figures alone.
    ///
    /// # Errors
    /// [`Error::NotFound`] without a source; [`Error::Store`].
    pub async fn remote(&self) -> Result<RemoteList> {
        let Some(Source(source)) = &self.remote else {
            return Err(Error::NotFound(
                "no broker: this console was given no NATS link (`--nats URL`)".into(),
            ));
        };
        let (consumers, error) =
            match tokio::time::timeout(REMOTE_TIMEOUT, source.consumers()).await {
                Ok(Ok(c)) => (c, None),
                Ok(Err(why)) => (Vec::new(), Some(format!("unreachable: {why}"))),
                Err(_) => (
                    Vec::new(),
                    Some(format!(
                        "unreachable: no answer within {}s",
                        REMOTE_TIMEOUT.as_secs()
                    )),
                ),
            };
        let waiting: BTreeMap<String, DestinationRows> = self
            .store
            .admin()
            .waiting_by_destination()
            .await?
            .into_iter()
            .map(|r| (r.destination.clone(), r))
            .collect();
        Ok(RemoteList {
            broker: source.describe(),
            error,
            destinations: join(source.declared(), consumers, &waiting),
        })
    }
}

/// One row per consumer, and one for each declared destination no consumer serves,
/// each with `waiting`'s rows of its destination; by destination, then consumer.
fn join(
    declared: Vec<String>,
    consumers: Vec<BrokerConsumer>,
    waiting: &BTreeMap<String, DestinationRows>,
) -> Vec<RemoteDoc> {
    let outbox = |d: &str| waiting.get(d).cloned().unwrap_or_default();
    let mut out: Vec<RemoteDoc> = declared
        .into_iter()
        .filter(|d| !consumers.iter().any(|c| c.destination == *d))
        .map(|destination| {
            let rows = outbox(&destination);
            RemoteDoc {
                destination,
                consumer: None,
                pending: None,
                ack_pending: None,
                redelivered: None,
                outbox_pending: rows.pending,
                outbox_in_flight: rows.in_flight,
                outbox_unavailable: rows.unavailable,
                unavailable: rows.unavailable_reason,
            }
        })
        .collect();
    out.extend(consumers.into_iter().map(|c| {
        let rows = outbox(&c.destination);
        RemoteDoc {
            destination: c.destination,
            consumer: Some(c.consumer),
            pending: Some(c.pending),
            ack_pending: Some(c.ack_pending),
            redelivered: Some(c.redelivered),
            outbox_pending: rows.pending,
            outbox_in_flight: rows.in_flight,
            outbox_unavailable: rows.unavailable,
            unavailable: rows.unavailable_reason,
        }
    }));
    out.sort_by(|a, b| (&a.destination, &a.consumer).cmp(&(&b.destination, &b.consumer)));
    out.dedup_by(|a, b| a.destination == b.destination && a.consumer == b.consumer);
    out
}
