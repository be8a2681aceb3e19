//! The task of one durable consumer of a [`NatsReceiver`](super::NatsReceiver): it
//! fetches batches in stream order and hands each to the [`Batcher`], one at a time,
//! until it is stopped. A failure of the server or of the store never ends it: it
//! waits (with backoff, its warnings thinning out) and goes on.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;

use super::NatsError;
use super::batch::{Batcher, Handled};
use super::right::{Held, acquire};
use crate::backoff::Backoff;

/// Extra time past `ack_wait` before a receiver fetches, when it found messages
/// delivered but not acknowledged: the server has queued them for redelivery by then.
const PAST_ACK_WAIT: Duration = Duration::from_millis(500);

/// One consumer's loop.
#[derive(Debug)]
pub(crate) struct Worker {
    pub(crate) js: jetstream::Context,
    pub(crate) stream: String,
    pub(crate) consumer: jetstream::consumer::pull::Config,
    pub(crate) batcher: Batcher,
    pub(crate) batch_size: usize,
    pub(crate) fetch_wait: Duration,
    pub(crate) ack_wait: Duration,
}

/// Counts a failure in a row (reset by a commit): whether to log it as a warning. The
/// 1st, 2nd, 4th, 8th… are: an outage logs a few lines, not one per attempt.
fn loud(failures: &mut u32) -> bool {
    *failures = failures.saturating_add(1);
    failures.is_power_of_two()
}

/// `fut`, unless `stop` turns true first (`None` then).
async fn until_stopped<F: Future>(stop: &mut watch::Receiver<bool>, fut: F) -> Option<F::Output> {
    if *stop.borrow() {
        return None;
    }
    tokio::select! {
        out = fut => Some(out),
        _ = stop.wait_for(|s| *s) => None,
    }
}

/// Whether `stop` turned true within `d`.
async fn stopped_within(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    until_stopped(stop, tokio::time::sleep(d)).await.is_none()
}

/// The durable consumer of `config` on `stream`, made unless it exists; an existing one
/// with another filter is refused (it would consume other subjects).
pub(crate) async fn consumer(
    js: &jetstream::Context,
    stream: &str,
    config: &jetstream::consumer::pull::Config,
) -> Result<PullConsumer, NatsError> {
    let name = config.durable_name.clone().unwrap_or_default();
    let failed = |reason: String| NatsError::Consumer {
        stream: stream.to_owned(),
        consumer: name.clone(),
        reason,
    };
    let s = js.get_stream(stream).await.map_err(|e| NatsError::Stream {
        stream: stream.to_owned(),
        reason: e.to_string(),
    })?;
    let c: PullConsumer = s
        .get_or_create_consumer(&name, config.clone())
        .await
        .map_err(|e| failed(e.to_string()))?;
    let have = &c.cached_info().config.filter_subject;
    if *have != config.filter_subject {
        return Err(failed(format!(
            "it exists with the filter subject `{have}`, not `{}`: delete it or name \
             another durable consumer",
            config.filter_subject
        )));
    }
    Ok(c)
}

impl Worker {
    /// Runs until `stop` turns true; starts with `first`, the consumer made at start.
    pub(crate) async fn run(self, first: PullConsumer, mut stop: watch::Receiver<bool>) {
        let mut next = Some(first);
        let mut backoff = Backoff::default();
        let mut failures: u32 = 0;
        let name = self.consumer.durable_name.as_deref().unwrap_or_default();
        let right_name = super::right::name(&self.stream, name);
        let mut right: Option<Held> = None;
        loop {
            let held = match &mut right {
                Some(held) => held,
                None => {
                    let Some(got) = acquire(
                        &self.batcher.store,
                        &right_name,
                        &self.batcher.counters,
                        &mut stop,
                    )
                    .await
                    else {
                        return;
                    };
                    right.insert(got)
                }
            };
            let attempt = match next.take() {
                Some(c) => Ok(c),
                None => {
                    match until_stopped(&mut stop, consumer(&self.js, &self.stream, &self.consumer))
                        .await
                    {
                        None => return,
                        Some(r) => r.map_err(|e| e.to_string()),
                    }
                }
            };
            let why = match attempt {
                Ok(c) => match self
                    .session(&c, &mut stop, &mut backoff, &mut failures, held)
                    .await
                {
                    Ok(()) => return,
                    Err(why) => why,
                },
                Err(why) => why,
            };
            if !held.still_held().await {
                // Asked for again (standing by while another process holds it).
                right = None;
            }
            super::counters::Counters::add(&self.batcher.counters.reconnects, 1);
            let delay = backoff.fail(Instant::now());
            if loud(&mut failures) {
                tracing::warn!(
                    consumer = name,
                    failures,
                    error = %why,
                    retry_in = ?delay,
                    "NATS receiver: the consumer failed; retrying"
                );
            } else {
                tracing::debug!(
                    consumer = name,
                    failures,
                    error = %why,
                    retry_in = ?delay,
                    "NATS receiver: the consumer failed; retrying"
                );
            }
            if stopped_within(&mut stop, delay).await {
                return;
            }
        }
    }

    /// Fetches and stores batches until stopped (`Ok`) or the consumer fails (`Err`).
    async fn session(
        &self,
        c: &PullConsumer,
        stop: &mut watch::Receiver<bool>,
        backoff: &mut Backoff,
        failures: &mut u32,
        right: &mut Held,
    ) -> Result<(), String> {
        // Messages delivered and not acknowledged (a predecessor died holding them, or
        // this receiver lost its connection) come back after ack_wait; fetched before,
        // later messages of their keys would be stored first.
        let info = match until_stopped(stop, c.get_info()).await {
            None => return Ok(()),
            Some(info) => info.map_err(|e| format!("consumer info: {e}"))?,
        };
        // Their redelivery is due after the consumer's ack_wait on the server, which
        // may be another configuration's (it is updated below, after the wait).
        let redelivery = info.config.ack_wait.max(self.ack_wait);
        if info.num_ack_pending > 0 {
            tracing::info!(
                unacknowledged = info.num_ack_pending,
                wait = ?redelivery,
                "NATS receiver: messages are delivered but not acknowledged; waiting for \
                 their redelivery before fetching"
            );
            if stopped_within(stop, redelivery + PAST_ACK_WAIT).await {
                return Ok(());
            }
        }
        if info.config.ack_wait != self.ack_wait {
            self.update_ack_wait(info.config.ack_wait).await;
        }
        // A full outbox (QueueFull) takes fewer messages: the batches shrink until one
        // fits, and grow back after a commit.
        let mut cap = self.batch_size;
        loop {
            let Some(batch) = until_stopped(stop, self.fetch(c, cap)).await else {
                return Ok(());
            };
            let (batch, cut) = batch?;
            if batch.is_empty() {
                continue;
            }
            // Not interrupted by a stop: the batch is stored and acknowledged, or
            // handed back.
            let span = tracing::debug_span!(
                "nats_receive_batch",
                consumer = self.consumer.durable_name.as_deref().unwrap_or_default(),
                messages = batch.len(),
                first_stream_seq = batch
                    .first()
                    .and_then(|m| m.info().ok())
                    .map(|i| i.stream_sequence),
            );
            // Stored only while this process holds the destination: one that lost its
            // database session may have been taken over; the batch comes back.
            if !right.still_held().await {
                return Err(format!(
                    "lost the right to receive (`{}`: its database session ended); \
                     another process may receive now",
                    right.name()
                ));
            }
            match tracing::Instrument::instrument(self.batcher.handle(&batch), span).await {
                Handled::Committed => {
                    backoff.reset();
                    *failures = 0;
                    cap = self.batch_size;
                }
                Handled::Nakked(e) => {
                    if matches!(e, agentsaga_core::Error::QueueFull { .. }) {
                        cap = (batch.len() / 2).max(1);
                    }
                    let delay = backoff.fail(Instant::now());
                    if loud(failures) {
                        tracing::warn!(
                            error = %e,
                            messages = batch.len(),
                            retry_in = ?delay,
                            "NATS receiver: cannot store a batch; handed it back"
                        );
                    } else {
                        tracing::debug!(
                            error = %e,
                            messages = batch.len(),
                            retry_in = ?delay,
                            "NATS receiver: cannot store a batch; handed it back"
                        );
                    }
                    if stopped_within(stop, delay).await {
                        return Ok(());
                    }
                }
                Handled::NakLost(e) => {
                    return Err(format!(
                        "cannot store a batch ({e}), nor hand all of it back"
                    ));
                }
            }
            if let Some(why) = cut {
                // The rest of the fetch is in limbo: the next session waits out ack_wait
                // for its redelivery (the server redelivers before anything new) before
                // it fetches again.
                super::counters::Counters::add(&self.batcher.counters.cut_fetches, 1);
                return Err(format!(
                    "a fetch ended before the server ended it ({why}); stored the {} \
                     messages that came, in order, and wait for the rest to come back",
                    batch.len()
                ));
            }
        }
    }

    /// Gives the consumer this receiver's `ack_wait` (it was made with `was`). On
    /// failure it keeps the old one, said in a warning: every session waits out the
    /// longer of the two anyway.
    async fn update_ack_wait(&self, was: Duration) {
        let name = self.consumer.durable_name.as_deref().unwrap_or_default();
        let updated = async {
            let stream = self.js.get_stream(&self.stream).await?;
            stream
                .create_consumer(self.consumer.clone())
                .await
                .map_err(async_nats::Error::from)
        };
        match updated.await {
            Ok(_) => tracing::info!(
                consumer = name,
                was = ?was,
                now = ?self.ack_wait,
                "NATS receiver: the consumer's ack_wait changed to this receiver's"
            ),
            Err(e) => tracing::warn!(
                consumer = name,
                kept = ?was,
                wanted = ?self.ack_wait,
                error = %e,
                "NATS receiver: could not change the consumer's ack_wait"
            ),
        }
    }

    /// The next batch, of at most `cap` messages and about [`FETCH_MAX_BYTES`]: waits up
    /// to `fetch_wait` for a first message, then takes what else is there now (one pull
    /// request at a time, so nothing beyond the batch is delivered to this receiver).
    /// Empty if nothing came.
    ///
    /// With the batch, why it ended before the server ended it (`Some`), if it did: the
    /// server sends a request's messages at once, so when no message has come for
    /// `ack_wait` (a slow or cut link), those still on their way are in limbo: lost with
    /// the request, they come back after `ack_wait`. What came is a prefix of the
    /// request's messages in stream order, and may be stored; nothing may be fetched
    /// before the rest come back.
    async fn fetch(&self, c: &PullConsumer, cap: usize) -> Result<Fetched, String> {
        let started = Instant::now();
        let mut out = Vec::with_capacity(cap);
        let first = c
            .batch()
            .max_messages(1)
            .expires(self.fetch_wait)
            .messages()
            .await
            .map_err(|e| format!("fetch: {e}"))?;
        // The request expires on the server after fetch_wait: an answer later than this
        // is not coming (and a message on its way comes back after ack_wait: the
        // session that follows this error waits for it).
        let first_limit = self.fetch_wait + Duration::from_secs(2);
        match collect(first, &mut out, Some(first_limit), first_limit).await {
            Ended::ByServer(Some(e)) if out.is_empty() => return Err(format!("fetch: {e}")),
            Ended::Cut(why) if out.is_empty() => return Err(format!("fetch: {why}")),
            Ended::Cut(why) => return Ok((out, Some(why))),
            Ended::ByServer(_) => {}
        }
        if out.is_empty() {
            if started.elapsed() < Duration::from_millis(20) {
                // A fetch answered at once with nothing: no busy loop on it.
                return Err("the server ended a fetch at once, with nothing".into());
            }
            return Ok((out, None));
        }
        if cap > 1 {
            // Answered at once with what there is (the server ends it with a status, or
            // when the count is reached): as long as messages keep coming, however slow
            // the link, the batch goes on.
            let rest = match c
                .fetch()
                .max_messages(cap - 1)
                .max_bytes(FETCH_MAX_BYTES)
                .messages()
                .await
            {
                Ok(rest) => rest,
                // The request may have reached the server: what it sent is in limbo.
                Err(e) => return Ok((out, Some(format!("fetch: {e}")))),
            };
            if let Ended::Cut(why) = collect(rest, &mut out, None, self.ack_wait).await {
                return Ok((out, Some(why)));
            }
        }
        Ok((out, None))
    }
}

/// A batch, and why it ended before the server ended it, if it did.
type Fetched = (Vec<jetstream::Message>, Option<String>);

/// At most this many bytes in the second request of a batch (a larger message comes
/// alone, as the first of the next).
const FETCH_MAX_BYTES: usize = 1 << 20;

/// How a pull request's messages ended.
enum Ended {
    /// The server ended it: all it sent for it came (a status that is an error, said).
    ByServer(Option<String>),
    /// This side gave up waiting (why): messages the server sent may be on their way.
    Cut(String),
}

/// Reads `batch` into `out` until it ends, `limit` (if any) passes, or no message comes
/// for `idle`.
async fn collect(
    mut batch: jetstream::consumer::pull::Batch,
    out: &mut Vec<jetstream::Message>,
    limit: Option<Duration>,
    idle: Duration,
) -> Ended {
    let deadline = limit.map(|l| Instant::now() + l);
    loop {
        let now = Instant::now();
        let mut until = now + idle;
        if let Some(d) = deadline {
            until = until.min(d);
        }
        match tokio::time::timeout_at(until, batch.next()).await {
            Ok(Some(Ok(m))) => out.push(m),
            Ok(None) => return Ended::ByServer(None),
            // A status from the server (the request ended: no more messages, its byte
            // limit reached, …): what it sent for it came before.
            Ok(Some(Err(e))) => return Ended::ByServer(Some(e.to_string())),
            Err(_) => {
                return Ended::Cut(format!(
                    "nothing from the server for {:?}: a slow or broken link",
                    until.saturating_duration_since(now)
                ));
            }
        }
    }
}
