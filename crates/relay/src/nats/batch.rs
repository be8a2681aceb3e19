//! One batch of a [`NatsReceiver`](super::NatsReceiver): each message judged (a good
//! one becomes the local outbox's message, a bad one a dead letter with its reason),
//! all of them stored in one transaction, and only then acknowledged, in stream order.

use std::collections::HashSet;
use std::sync::Arc;

use agentsaga_core::{Message, Store};
use async_nats::jetstream::{self, AckKind};

use super::counters::Counters;
use super::dead::{self, Origin};
use crate::received;

/// What became of a batch.
#[derive(Debug)]
pub(crate) enum Handled {
    /// Committed; each message acknowledged (an acknowledgement that failed only means
    /// a redelivery).
    Committed,
    /// The store failed: nothing was written, every message was handed back (`-NAK`,
    /// confirmed), so the server delivers them again before anything after them.
    Nakked(agentsaga_core::Error),
    /// The store failed and some message could not be handed back: the server
    /// redelivers it after `ack_wait` only.
    NakLost(agentsaga_core::Error),
}

/// What to do with one message.
enum Verdict {
    /// Enqueue it.
    Store(Message),
    /// Write it to the dead letters with the reason, with the `DeliveryFailed` notice
    /// to its `reply_to` if it has one, then terminate it.
    Dead(Message, String, Option<Message>),
    /// A repeat of an id earlier in the batch: acknowledged with it.
    Repeat,
    /// Not even a dead letter fits the store (a tiny size limit): logged, terminated.
    Unstorable,
}

/// Judges, stores and acknowledges batches for one receiver.
#[derive(Debug)]
pub(crate) struct Batcher {
    pub(crate) store: Store,
    pub(crate) stream: String,
    pub(crate) prefix: String,
    pub(crate) destinations: Vec<String>,
    pub(crate) counters: Arc<Counters>,
}

impl Batcher {
    fn accepts(&self, destination: &str) -> bool {
        self.destinations.iter().any(|d| d == destination)
    }

    /// Stores `batch` in one transaction, then acknowledges each message, in order.
    pub(crate) async fn handle(&self, batch: &[jetstream::Message]) -> Handled {
        Counters::add(&self.counters.received, batch.len());
        let mut seen = HashSet::new();
        let verdicts: Vec<Verdict> = batch.iter().map(|m| self.verdict(m, &mut seen)).collect();
        let good: Vec<Message> = verdicts
            .iter()
            .filter_map(|v| match v {
                Verdict::Store(m) => Some(m.clone()),
                _ => None,
            })
            .collect();
        let dead: Vec<(&Message, &str)> = verdicts
            .iter()
            .filter_map(|v| match v {
                Verdict::Dead(m, why, _) => Some((m, why.as_str())),
                _ => None,
            })
            .collect();
        let notices: Vec<Message> = verdicts
            .iter()
            .filter_map(|v| match v {
                Verdict::Dead(_, _, notice) => notice.clone(),
                _ => None,
            })
            .collect();
        if let Err(e) = self.write(&good, &dead, &notices).await {
            return self.nak_all(batch, e).await;
        }
        Counters::add(&self.counters.batches, 1);
        Counters::add(&self.counters.stored, good.len());
        Counters::add(&self.counters.dead_lettered, dead.len());
        let redelivered = batch
            .iter()
            .filter(|m| m.info().is_ok_and(|i| i.delivered > 1))
            .count();
        Counters::add(&self.counters.redelivered, redelivered);
        // After a first acknowledgement that fails (the server away), the others would
        // each wait out their timeout: they are left to come back, and be found stored.
        let mut lost = 0;
        for (i, (m, v)) in batch.iter().zip(&verdicts).enumerate() {
            let kind = match v {
                Verdict::Store(_) | Verdict::Repeat => AckKind::Ack,
                Verdict::Dead(..) | Verdict::Unstorable => AckKind::Term,
            };
            if let Err(e) = m.double_ack_with(kind).await {
                lost = batch.len() - i;
                tracing::debug!(subject = %m.subject, error = %e, "acknowledgement not confirmed");
                break;
            }
        }
        if lost > 0 {
            Counters::add(&self.counters.ack_failures, lost);
            tracing::warn!(
                unconfirmed = lost,
                "acknowledgements after a commit were not confirmed: those messages come \
                 back, and are found stored"
            );
        }
        tracing::debug!(
            stored = good.len(),
            dead = dead.len(),
            redelivered,
            "stored a batch received over NATS"
        );
        Handled::Committed
    }

    /// Enqueues the good messages, writes the dead letters and enqueues their
    /// `DeliveryFailed` notices, in one transaction.
    async fn write(
        &self,
        good: &[Message],
        dead: &[(&Message, &str)],
        notices: &[Message],
    ) -> agentsaga_core::Result<()> {
        let mut tx = self.store.begin().await?;
        if !good.is_empty() {
            tx.enqueue_batch(good).await?;
        }
        for (m, why) in dead {
            tx.enqueue_dead(m, why).await?;
        }
        if !notices.is_empty() {
            tx.enqueue_batch(notices).await?;
        }
        tx.commit().await
    }

    /// Hands every message of the batch back to the server, at once (the receiver
    /// waits out its backoff before it fetches again).
    async fn nak_all(&self, batch: &[jetstream::Message], e: agentsaga_core::Error) -> Handled {
        let mut lost = false;
        for m in batch {
            if m.double_ack_with(AckKind::Nak(None)).await.is_err() {
                // The rest would wait out their timeouts too: the receiver's session
                // starts again, and waits for their redelivery.
                lost = true;
                break;
            }
            Counters::add(&self.counters.naks, 1);
        }
        if lost {
            Handled::NakLost(e)
        } else {
            Handled::Nakked(e)
        }
    }

    fn verdict(
        &self,
        m: &jetstream::Message,
        seen: &mut HashSet<agentsaga_core::MessageId>,
    ) -> Verdict {
        let subject = m.subject.as_str();
        let origin = Origin {
            subject,
            stream: &self.stream,
            stream_seq: m.info().map_or(0, |i| i.stream_sequence),
            msg_id: m
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .map(|v| v.as_str()),
        };
        let limit = self.store.config().max_message_bytes;
        let home = subject
            .strip_prefix(self.prefix.as_str())
            .and_then(|rest| rest.strip_prefix('.'))
            .filter(|d| self.accepts(d));
        let (message, why, envelope) = match home {
            None => (
                dead::raw(origin, subject, &m.payload, limit),
                format!("subject `{subject}` is not one of this receiver's destinations"),
                None,
            ),
            Some(home) => match received::decode(&m.payload) {
                Err(refused) => (
                    dead::raw(origin, home, &m.payload, limit),
                    refused.to_string(),
                    m.headers
                        .as_ref()
                        .and_then(|h| dead::envelope_of_headers(origin, home, h)),
                ),
                Ok(envelope) if envelope.destination != home => (
                    dead::of_envelope(origin, home, &envelope, limit),
                    format!(
                        "the envelope's destination `{}` is not its subject's (`{subject}`)",
                        envelope.destination
                    ),
                    Some(envelope),
                ),
                Ok(envelope) => {
                    match received::message(&envelope, |d| self.accepts(d), &self.store) {
                        Ok(message) => {
                            if !seen.insert(message.id) {
                                return Verdict::Repeat;
                            }
                            tracing::debug!(
                                message.id = %message.id,
                                message.destination = %message.destination,
                                stream_seq = origin.stream_seq,
                                "received a message over NATS"
                            );
                            return Verdict::Store(message);
                        }
                        Err(refused) => (
                            dead::of_envelope(origin, home, &envelope, limit),
                            refused.to_string(),
                            Some(envelope),
                        ),
                    }
                }
            },
        };
        if let Err(e) = self.store.check_message(&message) {
            tracing::error!(
                subject,
                stream_seq = origin.stream_seq,
                reason = %why,
                error = %e,
                "a bad message received over NATS does not fit the store even as a dead \
                 letter: terminated without a trace in the store"
            );
            return Verdict::Unstorable;
        }
        if !seen.insert(message.id) {
            return Verdict::Repeat;
        }
        tracing::warn!(
            message.id = %message.id,
            message.destination = %message.destination,
            subject,
            stream_seq = origin.stream_seq,
            reason = %why,
            "dead-lettered a bad message received over NATS"
        );
        let notice = envelope.and_then(|e| dead::notice(&e, &why, &self.store));
        Verdict::Dead(message, why, notice)
    }
}
