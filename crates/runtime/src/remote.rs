//! (feature `nats`) Destinations served by other services, each with its own database,
//! over NATS JetStream (issue 36).
//!
//! A runtime given a [`NatsLink`] runs, beside its local relay:
//! - **a relay for its remote destinations** ([`RuntimeBuilder::remote`]): their outbox
//!   rows are published to the stream (`agentsaga.<destination>`, the message id as
//!   `Nats-Msg-Id`, its headers as NATS headers) and count as delivered only on the
//!   stream's acknowledgement, one in flight per key, as any relay delivers;
//! - **a receiver for its local destinations** (its agents', its sagas' replies): a
//!   durable consumer per destination, named after the link's service, stores what is
//!   published for them in this runtime's own outbox with the same id (a redelivery is
//!   a no-op), commits, and only then acknowledges; the local relay then hands each
//!   message to its actor, whose inbox makes it effectively-once, as for a local one.
//!
//! So a saga's command for a remote agent leaves in the saga's transaction (outbox),
//! crosses the broker at least once, lands once in the agent service's outbox, is
//! processed once there (inbox, with the agent's effects and its reply in one
//! transaction), and its reply comes back the same way. The wire format and the ack
//! contract: `agentsaga_relay::nats`.
//!
//! The agent service answers to the saga's reply destination (a command's `reply_to`
//! header, `saga.<name>.v<version>`): it declares it remote too, with
//! [`RuntimeBuilder::remote_saga`].
//!
//! [`RuntimeBuilder::remote`]: crate::RuntimeBuilder::remote
//! [`RuntimeBuilder::remote_saga`]: crate::RuntimeBuilder::remote_saga

use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::Store;
use agentsaga_relay::nats::{NatsConnect, NatsReceiver, NatsReceiverConfig, NatsTransport};
use agentsaga_relay::{Relay, RelayConfig};

use crate::{Error, Result};

/// The stream a [`NatsLink`] uses unless told otherwise.
pub const DEFAULT_STREAM: &str = "AGENTSAGA";

/// How a runtime reaches other services: a NATS server with JetStream, the stream, and
/// the name of this service (its durable consumers are named after it: give each
/// service its own, and keep it across restarts).
#[derive(Clone)]
pub struct NatsLink {
    /// The server and its credentials (shown redacted).
    to: NatsConnect,
    service: String,
    stream: String,
    ack_wait: Duration,
    transport: NatsTransport,
}

impl std::fmt::Debug for NatsLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsLink")
            .field("url", &self.to.shown())
            .field("service", &self.service)
            .field("stream", &self.stream)
            .field("ack_wait", &self.ack_wait)
            .finish_non_exhaustive()
    }
}

impl NatsLink {
    /// Connects to the server as `to` says (a URL, `nats://127.0.0.1:4222`, with the
    /// user and password or token its user info holds; or a [`NatsConnect`] with
    /// credentials and TLS, [`NatsConnect::from_env`] for the `AGENTSAGA_NATS_*`
    /// variables) as `service`, and
    /// makes the stream [`DEFAULT_STREAM`] over every agentsaga subject (a work queue:
    /// a message leaves it once acknowledged; a duplicate window of 2 minutes) unless
    /// it exists.
    ///
    /// # Errors
    /// [`Error::Config`] for a service name that cannot name a consumer (empty, or
    /// holding a space, `.`, `*` or `>`); [`Error::Remote`] if the server cannot be
    /// reached, refuses the credentials or the stream (the URL it names redacted).
    pub async fn connect(to: impl Into<NatsConnect>, service: &str) -> Result<Self> {
        let to = to.into();
        if service.is_empty()
            || service.contains(['.', '*', '>'])
            || service.contains(char::is_whitespace)
        {
            return Err(Error::Config(format!(
                "NATS service name `{service}`: it names durable consumers, so it must be \
                 non-empty, without spaces, `.`, `*` or `>`"
            )));
        }
        let transport = NatsTransport::connect(&to).await?;
        transport
            .ensure_stream(DEFAULT_STREAM, Duration::from_secs(120))
            .await?;
        Ok(Self {
            to,
            service: service.to_owned(),
            stream: DEFAULT_STREAM.to_owned(),
            ack_wait: Duration::from_secs(30),
            transport,
        })
    }

    /// How long the server waits for this service's acknowledgement of a message
    /// before it delivers it again (30 s unless set). A receiver that starts after a
    /// crash waits this long before its first fetch, so that what its predecessor held
    /// unacknowledged comes back before later messages of the same keys.
    #[must_use]
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// How long a publish waits for the stream's acknowledgement (10 s unless set).
    /// A publish not acknowledged in time (the broker away, the connection broken)
    /// spends no attempt of the relay's retry policy: the row waits in the outbox,
    /// shown as waiting for the broker, however long the outage lasts.
    #[must_use]
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.transport = self.transport.timeout(timeout);
        self
    }

    /// The server's URL as it may be shown: its password or token as `***`.
    pub fn url(&self) -> &str {
        self.to.shown()
    }

    /// This service's name.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// The subject `destination` is published to, or why it has none.
    pub(crate) fn check(&self, destination: &str) -> Result<()> {
        self.transport
            .subject(destination)
            .map(|_| ())
            .map_err(Error::Config)
    }
}

#[cfg(feature = "console")]
mod view;

/// What a linked runtime runs for its link: stopped by [`Runtime::shutdown`](crate::Runtime::shutdown).
pub(crate) struct Linked {
    receiver: NatsReceiver,
    relay: Option<Relay>,
    /// The broker's figures for its console.
    #[cfg(feature = "console")]
    source: std::sync::Arc<view::LinkSource>,
}

impl Linked {
    /// Starts the receiver of `local` destinations and, if any, the relay of
    /// `remote` ones (the local relay's settings, without handover: the transport is
    /// the broker, not this process's actors).
    pub(crate) async fn start(
        store: &Store,
        link: &NatsLink,
        local: &[String],
        remote: &[String],
        relay: &RelayConfig,
    ) -> Result<Self> {
        let receiver = NatsReceiver::start(
            &link.to,
            store.clone(),
            NatsReceiverConfig::new(link.stream.clone(), link.service.clone())
                .destinations(local.iter().cloned())
                .ack_wait(link.ack_wait)
                // A fetch must end well within the ack wait.
                .fetch_wait((link.ack_wait / 2).min(Duration::from_secs(5))),
        )
        .await?;
        let relay = if remote.is_empty() {
            None
        } else {
            let mut config = relay.clone();
            config.handover = false;
            // Its own name in leases and logs, and the default number of publishes at
            // once (not the sum of the local actors' concurrency).
            config.owner = format!("{}-nats", config.owner);
            config.workers = RelayConfig::default().workers;
            Some(
                Relay::start(
                    store.clone(),
                    remote.to_vec(),
                    Arc::new(link.transport.clone()),
                    config,
                )
                .await?,
            )
        };
        Ok(Self {
            receiver,
            relay,
            #[cfg(feature = "console")]
            source: std::sync::Arc::new(view::LinkSource {
                transport: link.transport.clone(),
                url: link.to.shown().to_owned(),
                stream: link.stream.clone(),
                declared: remote.iter().chain(local).cloned().collect(),
            }),
        })
    }

    /// Where this runtime's console reads the broker's figures.
    #[cfg(feature = "console")]
    pub(crate) fn source(&self) -> std::sync::Arc<dyn agentsaga_console::ops::RemoteSource> {
        self.source.clone()
    }

    /// Stops taking messages from the broker, then publishing to it.
    pub(crate) async fn stop(self) {
        self.receiver.stop().await;
        if let Some(relay) = self.relay {
            relay.shutdown().await;
        }
    }
}
