//! (features `nats` and `console`) The broker's figures for a runtime's console: the
//! consumers of the destinations it sends to and of those it hosts, read through its
//! link (see [`Console::remote`](agentsaga_console::Console::remote)).

use agentsaga_console::ops::{BrokerConsumer, RemoteSource};
use agentsaga_relay::nats::NatsTransport;

/// A runtime's destinations on the broker, read through its link.
pub(crate) struct LinkSource {
    pub(crate) transport: NatsTransport,
    /// The broker's URL, redacted.
    pub(crate) url: String,
    pub(crate) stream: String,
    /// Its remote destinations, then the ones it hosts.
    pub(crate) declared: Vec<String>,
}

#[async_trait::async_trait]
impl RemoteSource for LinkSource {
    fn describe(&self) -> String {
        format!("{}, stream {}", self.url, self.stream)
    }

    fn declared(&self) -> Vec<String> {
        self.declared.clone()
    }

    async fn consumers(&self) -> Result<Vec<BrokerConsumer>, String> {
        let lags = self
            .transport
            .consumer_lag(&self.stream)
            .await
            .map_err(|e| e.to_string())?;
        Ok(lags
            .into_iter()
            .filter_map(|l| {
                let destination = l.destination.filter(|d| self.declared.contains(d))?;
                Some(BrokerConsumer {
                    consumer: l.consumer,
                    destination,
                    pending: l.pending,
                    ack_pending: l.ack_pending,
                    redelivered: l.redelivered,
                })
            })
            .collect())
    }
}
