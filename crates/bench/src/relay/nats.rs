//! `relay --transport nats`: how fast a relay publishes a keyed backlog to NATS
//! JetStream (`NatsTransport`: each message published with its id as `Nats-Msg-Id` and
//! counted delivered on the stream's acknowledgement), against a floor of plain
//! `async-nats` publishes with acknowledgements of the same envelopes, as many in
//! flight as the relay has workers. Each run has a fresh `nats-server -js` and a
//! fresh stream; the stream is checked to hold the whole backlog after each.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agentsaga_core::{Envelope, Headers, MessageId};
use agentsaga_relay::nats::NatsTransport;
use anyhow::{Context, ensure};

use crate::db::{Backend, Scratch};
use crate::outbox::{self, DEST};

/// The stream the runs publish to (the runtime's link's default name).
const STREAM: &str = "AGENTSAGA";
/// Subjects are `agentsaga.<destination>`, as the transport's default prefix.
const SUBJECT: &str = "agentsaga.bench";

/// (relay median, floor median), msgs/s, over `backlog` messages per run.
pub(super) async fn publish(
    backend: Backend,
    backlog: usize,
    rounds: usize,
    workers: usize,
    scratch: &mut Scratch,
) -> anyhow::Result<(f64, f64)> {
    let template = scratch.fresh_url(backend).await?;
    outbox::fill(&template, backlog).await?;
    outbox::prepare_template(backend, &template).await?;
    let (mut relay_rates, mut floor_rates) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let relay_first = round % 2 == 0;
        for relay_side in [relay_first, !relay_first] {
            let server = crate::saga::nats_server().await?;
            let transport = NatsTransport::connect(&server.url()).await?;
            transport
                .ensure_stream(STREAM, Duration::from_secs(120))
                .await?;
            let rate = if relay_side {
                let url = scratch.copy_of(backend, &template).await?;
                super::drain::relay_drain(&url, backlog, workers, Arc::new(transport)).await?
            } else {
                floor_publish(&server.url(), backlog, workers).await?
            };
            let held = stream_messages(&server.url()).await?;
            ensure!(
                held == backlog as u64,
                "the stream holds {held} messages after publishing {backlog}"
            );
            let side = if relay_side { "relay" } else { "floor" };
            eprintln!(
                "{:<8} {:<22} round {}/{rounds}  {side:<5} {rate:>10.0} msgs/s",
                backend.name(),
                "nats_publish_rate",
                round + 1,
            );
            if relay_side {
                relay_rates.push(rate);
            } else {
                floor_rates.push(rate);
            }
        }
    }
    Ok((outbox::median(relay_rates), outbox::median(floor_rates)))
}

/// `workers` tasks, each encoding the next envelope as the transport does and
/// publishing it with its id, awaiting the stream's acknowledgement before the next.
async fn floor_publish(server: &str, backlog: usize, workers: usize) -> anyhow::Result<f64> {
    let client = async_nats::connect(server).await?;
    let js = async_nats::jetstream::new(client);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (js, next) = (js.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= backlog {
                    return anyhow::Ok(());
                }
                let envelope = envelope(i)?;
                let payload = serde_json::to_vec(&envelope)?;
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(
                    async_nats::header::NATS_MESSAGE_ID,
                    envelope.id.to_string().as_str(),
                );
                js.publish_with_headers(SUBJECT, headers, payload.into())
                    .await?
                    .await?;
            }
        }));
    }
    for task in tasks {
        task.await.context("a publishing task")??;
    }
    Ok(backlog as f64 / start.elapsed().as_secs_f64())
}

/// The `i`-th backlog row as the relay hands it to its transport.
fn envelope(i: usize) -> anyhow::Result<Envelope> {
    Ok(Envelope {
        seq: i as i64 + 1,
        id: MessageId::new(),
        destination: DEST.to_owned(),
        key: Some(outbox::key(i)),
        payload: serde_json::to_string(&outbox::payload(i))?,
        headers: Headers::new(),
        attempts: 1,
        created_at_ms: outbox::now_ms(),
    })
}

/// The messages the stream holds.
async fn stream_messages(server: &str) -> anyhow::Result<u64> {
    let client = async_nats::connect(server).await?;
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream(STREAM).await?;
    Ok(stream.info().await?.state.messages)
}
