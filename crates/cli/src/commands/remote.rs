//! `agentsaga remote` (and `remote` in `status`, `serve` and `mcp` given `--nats`):
//! the destinations served over NATS JetStream, with the broker's figures beside this
//! database's outbox rows waiting for them.

use std::sync::Arc;

use agentsaga_console::Console;
use agentsaga_console::ops::{BrokerConsumer, RemoteList, RemoteSource};
use agentsaga_relay::nats::{NatsConnect, NatsTransport};
use anyhow::bail;
use tokio::sync::Mutex;

use crate::format::{Table, print_json};

/// The stream a runtime's `NatsLink` makes and uses.
const STREAM: &str = "AGENTSAGA";

/// The broker `to` names, connected at its first reading and kept.
struct Broker {
    /// The server and its credentials (shown redacted).
    to: NatsConnect,
    /// Only the consumers of this service (`<service>_…`).
    service: Option<String>,
    transport: Mutex<Option<NatsTransport>>,
}

#[async_trait::async_trait]
impl RemoteSource for Broker {
    fn describe(&self) -> String {
        match &self.service {
            Some(s) => format!("{}, stream {STREAM}, service {s}", self.to),
            None => format!("{}, stream {STREAM}", self.to),
        }
    }

    async fn consumers(&self) -> Result<Vec<BrokerConsumer>, String> {
        let mut held = self.transport.lock().await;
        let transport = match &*held {
            Some(t) => t.clone(),
            None => {
                let t = NatsTransport::connect(&self.to)
                    .await
                    .map_err(|e| e.to_string())?;
                held.insert(t).clone()
            }
        };
        drop(held);
        let lags = transport
            .consumer_lag(STREAM)
            .await
            .map_err(|e| e.to_string())?;
        let prefix = self.service.as_ref().map(|s| format!("{s}_"));
        Ok(lags
            .into_iter()
            .filter(|l| prefix.as_ref().is_none_or(|p| l.consumer.starts_with(p)))
            .filter_map(|l| {
                Some(BrokerConsumer {
                    destination: l.destination?,
                    consumer: l.consumer,
                    pending: l.pending,
                    ack_pending: l.ack_pending,
                    redelivered: l.redelivered,
                })
            })
            .collect())
    }
}

/// `console` reading the broker `to` names (`--nats` and its options), if given.
pub(super) fn with_broker(
    console: Console,
    to: Option<NatsConnect>,
    service: Option<String>,
) -> Console {
    match to {
        Some(to) => console.with_remote(Arc::new(Broker {
            to,
            service,
            transport: Mutex::new(None),
        })),
        None => console,
    }
}

pub(super) async fn run(console: &Console, json: bool) -> anyhow::Result<()> {
    if !console.has_remote() {
        bail!(
            "`remote` reads the broker: give it with --nats nats://HOST:PORT (or AGENTSAGA_NATS)"
        );
    }
    let doc = console.remote().await?;
    if json {
        print_json(&doc)?;
    } else {
        print(&doc);
    }
    match &doc.error {
        Some(e) => bail!("the broker's figures are missing: {e}"),
        None => Ok(()),
    }
}

/// The remote destinations as a table.
pub(super) fn print(doc: &RemoteList) {
    outln!("broker: {}", doc.broker);
    if let Some(e) = &doc.error {
        outln!("broker {e}: its figures are missing (-)");
    }
    if doc.destinations.is_empty() {
        if doc.error.is_none() {
            outln!("no consumer on the broker");
        }
        return;
    }
    let mut table = Table::new(&[
        "DESTINATION",
        "CONSUMER",
        "BROKER PENDING",
        "IN SERVICE'S HANDS",
        "REDELIVERED",
        "OUTBOX PENDING",
        "OUTBOX IN FLIGHT",
        "UNREACHABLE",
    ])
    .right(&[2, 3, 4, 5, 6, 7]);
    let n = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    for d in &doc.destinations {
        table.row(vec![
            d.destination.clone(),
            d.consumer.clone().unwrap_or_else(|| "-".into()),
            n(d.pending),
            n(d.ack_pending),
            n(d.redelivered),
            d.outbox_pending.to_string(),
            d.outbox_in_flight.to_string(),
            d.outbox_unavailable.to_string(),
        ]);
    }
    out!("{}", table.render());
    // Why the broker could not be reached, once per destination waiting for it.
    let mut said = std::collections::BTreeSet::new();
    for d in &doc.destinations {
        if let Some(why) = d.unavailable.as_ref().filter(|_| d.outbox_unavailable > 0)
            && said.insert(&d.destination)
        {
            outln!(
                "{}: {} rows wait for it (no attempt spent): {why}",
                d.destination,
                d.outbox_unavailable
            );
        }
    }
}
