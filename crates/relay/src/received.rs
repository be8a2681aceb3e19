//! An envelope that another service sent, checked and turned into a message of the
//! local outbox: what every receiving side (the HTTP receiver, the NATS receiver) does
//! the same way before it stores it.
//!
//! The message keeps the envelope's id, destination, key, payload and headers; the
//! envelope's `seq`, `attempts` and `created_at_ms` are the sender's bookkeeping and
//! are not kept. Keeping the id is what makes a redelivery harmless: enqueueing an id
//! that the outbox already holds is a no-op.

use agentsaga_core::{Envelope, Error as StoreError, Message, Store};

/// Why a received envelope is not a message this side stores.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    /// The body is not a JSON envelope.
    #[error("malformed envelope: {0}")]
    Malformed(serde_json::Error),
    /// The envelope names no destination.
    #[error("the envelope's destination is empty")]
    EmptyDestination,
    /// The envelope's destination is not one this side receives.
    #[error("destination {0} is not received here")]
    NotReceivedHere(String),
    /// The envelope's payload is not JSON.
    #[error("the envelope's payload is not JSON: {0}")]
    PayloadNotJson(serde_json::Error),
    /// The store does not take the message (its size limit).
    #[error(transparent)]
    Store(StoreError),
}

/// Decodes a JSON envelope.
pub(crate) fn decode(body: &[u8]) -> Result<Envelope, Refused> {
    serde_json::from_slice(body).map_err(Refused::Malformed)
}

/// The message of `envelope` (same id, destination, key, payload and headers), if its
/// destination is one that `accepts` takes and `store` would enqueue it. Checked before
/// any transaction opens, so that garbage opens none, and a bad message of a batch does
/// not fail the good ones stored with it.
pub(crate) fn message(
    envelope: &Envelope,
    accepts: impl Fn(&str) -> bool,
    store: &Store,
) -> Result<Message, Refused> {
    let destination = envelope.destination.as_str();
    if destination.trim().is_empty() {
        return Err(Refused::EmptyDestination);
    }
    if !accepts(destination) {
        return Err(Refused::NotReceivedHere(destination.to_owned()));
    }
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&envelope.payload) {
        return Err(Refused::PayloadNotJson(e));
    }
    let mut message = Message::to(destination)
        .id(envelope.id)
        .raw_json(envelope.payload.as_str())
        .headers(envelope.headers.clone());
    if let Some(key) = &envelope.key {
        message = message.key(key.as_str());
    }
    store.check_message(&message).map_err(Refused::Store)?;
    Ok(message)
}
