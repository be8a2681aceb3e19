//! Messages going into the outbox, and envelopes coming out of it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::{Error, MessageId, Result};

/// Message headers: trace context, correlation ids, saga bookkeeping.
pub type Headers = BTreeMap<String, String>;

/// Well-known header names.
pub mod header {
    /// W3C trace context of the span that enqueued the message.
    pub const TRACEPARENT: &str = "traceparent";
    /// W3C trace state.
    pub const TRACESTATE: &str = "tracestate";
    /// Where the consumer sends its answer, and where the relay sends a
    /// `DeliveryFailed` notice if the message is dead-lettered.
    pub const REPLY_TO: &str = "reply_to";
    /// The saga this message belongs to.
    pub const SAGA_ID: &str = "saga_id";
    /// What kind of message this is (`command`, `reply`, `timeout`, ...).
    pub const KIND: &str = "kind";
    /// The id of the message that caused this one.
    pub const CAUSATION_ID: &str = "causation_id";
    /// The `kind` header's value on a [`DeliveryFailed`](super::DeliveryFailed) notice.
    pub const KIND_DELIVERY_FAILED: &str = "delivery_failed";
    /// The key a consumer passes to the outside APIs it calls for this message (an
    /// `Idempotency-Key` header): equal for every delivery and re-send of one unit of
    /// work, different between units. Saga commands carry
    /// `agentsaga:<saga id>:<step>:command` (or `:compensate`); a message without
    /// it uses its own id.
    pub const IDEMPOTENCY_KEY: &str = "idempotency_key";
    /// How long, in milliseconds, the consumer may work on this message once it has
    /// started (a saga step's `timeout`); past it the work is cancelled.
    pub const TIMEOUT_MS: &str = "timeout_ms";
}

/// The notice the relay enqueues to a dead-lettered message's `reply_to`, in the same
/// transaction that dead-letters it, so that whoever waits for an answer learns that
/// none will come. It carries the original message's headers (saga id, step, ...) with
/// `kind` set to [`header::KIND_DELIVERY_FAILED`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct DeliveryFailed {
    /// The message that was given up on.
    pub message_id: MessageId,
    /// Where it was going.
    pub destination: String,
    /// Why it was given up on.
    pub reason: String,
}

impl DeliveryFailed {
    /// The notice for `envelope`, or `None` if it has no `reply_to` header.
    ///
    /// # Errors
    /// [`Error::Json`] if the notice cannot be serialized (it always can).
    pub fn notice_for(envelope: &Envelope, reason: &str) -> Result<Option<Message>> {
        let Some(reply_to) = envelope.header(header::REPLY_TO) else {
            return Ok(None);
        };
        let mut headers = envelope.headers.clone();
        headers.remove(header::REPLY_TO);
        headers.insert(header::KIND.into(), header::KIND_DELIVERY_FAILED.into());
        headers.insert(header::CAUSATION_ID.into(), envelope.id.to_string());
        let notice = DeliveryFailed {
            message_id: envelope.id,
            destination: envelope.destination.clone(),
            reason: reason.to_owned(),
        };
        Ok(Some(Message::to(reply_to).headers(headers).json(&notice)?))
    }
}

/// A message to be written to the outbox in the caller's transaction.
///
/// ```
/// use std::time::Duration;
/// use agentsaga_core::Message;
///
/// # fn main() -> Result<(), agentsaga_core::Error> {
/// let msg = Message::to("flights")
///     .key("trip-42")
///     .json(&serde_json::json!({ "reserve": "LH123" }))?
///     .header("reply_to", "orchestrator")
///     .delay(Duration::from_secs(5));
/// assert_eq!(msg.destination, "flights");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct Message {
    /// Its id (a fresh UUIDv7 unless set with [`id`](Self::id)).
    pub id: MessageId,
    /// Where it goes.
    pub destination: String,
    /// The ordering key, if any: messages of one key are delivered one at a time, in
    /// order.
    pub key: Option<String>,
    /// The payload as JSON text (checked to be JSON when it is enqueued).
    pub payload: String,
    /// Its headers.
    pub headers: Headers,
    /// How long after the enqueuing transaction it becomes deliverable.
    pub delay: Duration,
}

impl Message {
    /// A message to `destination` with a `null` payload and a fresh UUIDv7 id.
    pub fn to(destination: impl Into<String>) -> Self {
        Self {
            id: MessageId::new(),
            destination: destination.into(),
            key: None,
            payload: "null".to_owned(),
            headers: Headers::new(),
            delay: Duration::ZERO,
        }
    }

    /// The ordering key: messages sharing a key are delivered one at a time, in order.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The payload, serialized to JSON.
    ///
    /// # Errors
    /// [`Error::Json`] if `value` cannot be serialized.
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Result<Self> {
        self.payload = serde_json::to_string(value)?;
        Ok(self)
    }

    /// The payload as already-serialized JSON text. It is checked to be valid JSON at
    /// enqueue time.
    pub fn raw_json(mut self, json: impl Into<String>) -> Self {
        self.payload = json.into();
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Replaces all headers.
    pub fn headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// Deliver no sooner than `delay` after the enqueuing transaction (a durable timer).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// A caller-chosen id: enqueueing the same id twice stores the message once.
    pub fn id(mut self, id: MessageId) -> Self {
        self.id = id;
        self
    }

    /// Size counted against the store's message limit: payload plus headers.
    pub(crate) fn size(&self) -> usize {
        self.payload.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }

    pub(crate) fn delay_ms(&self) -> i64 {
        crate::clock::millis(self.delay)
    }
}

/// A message claimed from the outbox, on its way to its destination.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Envelope {
    /// Position in the outbox (the order of rows).
    pub seq: i64,
    /// The message id.
    pub id: MessageId,
    /// Where it goes.
    pub destination: String,
    /// The ordering key.
    pub key: Option<String>,
    /// JSON payload text.
    pub payload: String,
    /// Headers.
    pub headers: Headers,
    /// Delivery attempts so far, this one included.
    pub attempts: u32,
    /// When the enqueuing transaction wrote it, Unix milliseconds.
    pub created_at_ms: i64,
}

impl Envelope {
    /// Decode the payload into `T`.
    ///
    /// # Errors
    /// [`Error::Json`] if the payload does not decode into `T`.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        Ok(serde_json::from_str(&self.payload)?)
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

pub(crate) fn validate(msg: &Message, max_size: usize) -> Result<()> {
    if msg.destination.trim().is_empty() {
        return Err(Error::EmptyDestination);
    }
    let size = msg.size();
    if size > max_size {
        return Err(Error::PayloadTooLarge {
            size,
            limit: max_size,
        });
    }
    // Catch raw payloads that are not JSON here, with a typed error, instead of a
    // database error from the jsonb cast (Postgres) or silent garbage (SQLite).
    serde_json::from_str::<serde::de::IgnoredAny>(&msg.payload)?;
    Ok(())
}
