//! The relay draining a backlog through a transport, timed: the `drain_rate` of the
//! relay bench (a no-op transport) and its NATS publish rate share it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentsaga_core::{Envelope, Store};
use agentsaga_relay::{Delivery, Relay, Transport};
use anyhow::{bail, ensure};

use super::setup::relay_config;
use crate::outbox::DEST;

/// Delivers everything, at once.
pub(super) struct NoOp;

#[async_trait::async_trait]
impl Transport for NoOp {
    async fn deliver(&self, _envelope: &Envelope) -> Delivery {
        Delivery::Delivered
    }
}

/// A relay draining the backlog at `url` through `transport`: msgs/s from its start
/// until its counters say all are delivered (acknowledged and marked).
pub(super) async fn relay_drain(
    url: &str,
    backlog: usize,
    workers: usize,
    transport: Arc<dyn Transport>,
) -> anyhow::Result<f64> {
    let store = Store::connect(url).await?;
    let start = Instant::now();
    let relay = Relay::start(
        store.clone(),
        vec![DEST.to_owned()],
        transport,
        relay_config(workers),
    )
    .await?;
    let deadline = start + Duration::from_secs(900);
    let stats = loop {
        let stats = relay.stats();
        if stats.delivered >= backlog as u64 {
            break stats;
        }
        if Instant::now() > deadline {
            bail!(
                "the relay delivered {} of {backlog} rows in 15 minutes",
                stats.delivered
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let elapsed = start.elapsed();
    relay.shutdown().await;
    store.close().await;
    ensure!(
        stats.delivered == backlog as u64 && stats.dead == 0 && stats.retried == 0,
        "the relay drained badly: {stats:?}"
    );
    Ok(backlog as f64 / elapsed.as_secs_f64())
}
