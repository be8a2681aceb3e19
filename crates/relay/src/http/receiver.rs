//! The receiving side: an axum router that stores incoming envelopes in the local
//! outbox before acknowledging them.

use std::fmt;
use std::sync::Arc;

use agentsaga_core::{Envelope, Error as StoreError, Message, Store};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::header::{AUTHORIZATION, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use crate::received::{self, Refused};
use crate::{Error, Result};

/// The path [`router`] serves: `POST /outbox`.
pub const OUTBOX_PATH: &str = "/outbox";

/// How the receiving side of the HTTP transport accepts envelopes.
///
/// ```
/// use agentsaga_relay::http::ReceiverConfig;
///
/// let config = ReceiverConfig::new("s3cret")
///     .max_body_bytes(256 * 1024)
///     .destinations(["billing", "shipping"]);
/// assert_eq!(config.max_body_bytes, 256 * 1024);
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct ReceiverConfig {
    /// The bearer token senders must present (`Authorization: Bearer <token>`); the
    /// same as their [`HttpTransport`](super::HttpTransport)'s. Must not be empty.
    pub token: String,
    /// Bodies larger than this are refused with 413 (default 1 MiB).
    pub max_body_bytes: usize,
    /// Accept only envelopes for these destinations (others: 404); `None` (the default)
    /// accepts every destination.
    pub destinations: Option<Vec<String>>,
}

impl fmt::Debug for ReceiverConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReceiverConfig")
            .field("token", &"<redacted>")
            .field("max_body_bytes", &self.max_body_bytes)
            .field("destinations", &self.destinations)
            .finish()
    }
}

impl ReceiverConfig {
    /// Accepts senders presenting `token`, bodies up to 1 MiB, every destination.
    pub fn new(token: impl Into<String>) -> Self {
        Self {
            token: token.into(),
            max_body_bytes: 1024 * 1024,
            destinations: None,
        }
    }

    /// Sets [`max_body_bytes`](Self::max_body_bytes).
    #[must_use]
    pub fn max_body_bytes(mut self, max_body_bytes: usize) -> Self {
        self.max_body_bytes = max_body_bytes;
        self
    }

    /// Sets [`destinations`](Self::destinations): only these are accepted.
    #[must_use]
    pub fn destinations<I, S>(mut self, destinations: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.destinations = Some(destinations.into_iter().map(Into::into).collect());
        self
    }

    fn validate(&self) -> Result<()> {
        let problem = if self.token.trim().is_empty() {
            "the receiver's bearer token must not be empty"
        } else if self.max_body_bytes == 0 {
            "max_body_bytes must be at least 1"
        } else if self.destinations.as_ref().is_some_and(Vec::is_empty) {
            "destinations is an empty list: nothing could be received (use None for all)"
        } else if self
            .destinations
            .iter()
            .flatten()
            .any(|d| d.trim().is_empty())
        {
            "a destination is empty"
        } else {
            return Ok(());
        };
        Err(Error::Config(problem.to_owned()))
    }
}

/// The receiving side of the HTTP transport: an axum router serving
/// `POST `[`OUTBOX_PATH`] that stores each envelope in `store`'s outbox.
///
/// A request is answered:
///
/// | answer | when | written |
/// | --- | --- | --- |
/// | 401 | no `Authorization: Bearer` header, or the wrong token (compared in constant time) | nothing |
/// | 413 | a body over [`max_body_bytes`](ReceiverConfig::max_body_bytes), or a message over the store's size limit | nothing |
/// | 400 | a body that is not a JSON envelope, an empty destination, a payload that is not JSON | nothing |
/// | 404 | a destination not in [`destinations`](ReceiverConfig::destinations) | nothing |
/// | 503 | the database failed, or the outbox is full (with `Retry-After: 1`): the sender retries | nothing |
/// | 204 | the message was enqueued (same id, destination, key, payload and headers) and committed | once |
///
/// Error answers carry a short plain-text reason. The envelope's `seq`, `attempts` and
/// `created_at_ms` are the sender's bookkeeping and are not kept. A message whose id is
/// already in the outbox is not stored again but still answered 204: a redelivery
/// is acknowledged, and processed once (while the row is kept: prune delivered rows,
/// [`Admin::prune_delivered`](agentsaga_core::admin::Admin::prune_delivered), only well after any redelivery can come). The commit wakes the relays of this process,
/// which deliver the message to its local destination.
///
/// Serve it with `axum::serve`, alone or merged into a larger router.
///
/// # Errors
/// [`Error::Config`] for an empty token, a zero body cap, or an empty list of
/// destinations.
pub fn router(store: Store, config: ReceiverConfig) -> Result<Router> {
    config.validate()?;
    let receiver = Arc::new(Receiver {
        store,
        token: config.token.into_bytes(),
        destinations: config.destinations,
    });
    Ok(Router::new()
        .route(OUTBOX_PATH, post(receive))
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(receiver))
}

struct Receiver {
    store: Store,
    token: Vec<u8>,
    destinations: Option<Vec<String>>,
}

impl Receiver {
    fn accepts(&self, destination: &str) -> bool {
        self.destinations
            .as_ref()
            .is_none_or(|ds| ds.iter().any(|d| d == destination))
    }
}

/// Whether the request presents `token`: `Authorization: Bearer <token>`, the scheme in
/// any case.
fn authorized(headers: &HeaderMap, token: &[u8]) -> bool {
    let Some(value) = headers.get(AUTHORIZATION) else {
        return false;
    };
    let Some((scheme, given)) = value.as_bytes().split_at_checked(7) else {
        return false;
    };
    scheme.eq_ignore_ascii_case(b"bearer ") && same_token(given.trim_ascii(), token)
}

/// Compares `given` with `expected` in time that depends on `expected`'s length only.
fn same_token(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = given.len() ^ expected.len();
    for (i, e) in expected.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!e);
        diff |= usize::from(g ^ e);
    }
    diff == 0
}

fn reason(status: StatusCode, reason: impl Into<String>) -> Response {
    (status, reason.into()).into_response()
}

async fn receive(State(receiver): State<Arc<Receiver>>, request: Request) -> Response {
    if !authorized(request.headers(), &receiver.token) {
        tracing::debug!("refused an HTTP delivery: missing or wrong bearer token");
        return (
            StatusCode::UNAUTHORIZED,
            [(WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong bearer token",
        )
            .into_response();
    }
    // Read only once authorized; the body limit layer caps it.
    let body = match Bytes::from_request(request, &()).await {
        Ok(body) => body,
        Err(rejection) => return reason(rejection.status(), rejection.body_text()),
    };
    let envelope = match received::decode(&body) {
        Ok(envelope) => envelope,
        Err(refused) => return reason(StatusCode::BAD_REQUEST, refused.to_string()),
    };
    let message = match received::message(&envelope, |d| receiver.accepts(d), &receiver.store) {
        Ok(message) => message,
        Err(refused @ Refused::NotReceivedHere(_)) => {
            return reason(StatusCode::NOT_FOUND, refused.to_string());
        }
        Err(Refused::Store(e)) => return store_failure(&e, &envelope),
        Err(refused) => return reason(StatusCode::BAD_REQUEST, refused.to_string()),
    };
    let (id, destination) = (envelope.id, envelope.destination.as_str());
    match store(&receiver.store, &message).await {
        Ok(()) => {
            tracing::debug!(
                message.id = %id,
                message.destination = %destination,
                "stored a message received over HTTP"
            );
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => store_failure(&e, &envelope),
    }
}

/// Enqueues `message` in a transaction of its own and commits it.
async fn store(store: &Store, message: &Message) -> agentsaga_core::Result<()> {
    let mut tx = store.begin().await?;
    tx.enqueue(message).await?;
    tx.commit().await
}

fn store_failure(e: &StoreError, envelope: &Envelope) -> Response {
    match e {
        StoreError::EmptyDestination | StoreError::Json(_) => {
            reason(StatusCode::BAD_REQUEST, e.to_string())
        }
        StoreError::PayloadTooLarge { .. } => reason(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
        StoreError::QueueFull { .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(RETRY_AFTER, "1")],
            e.to_string(),
        )
            .into_response(),
        _ => {
            tracing::warn!(
                message.id = %envelope.id,
                message.destination = %envelope.destination,
                error = %e,
                transient = e.is_transient(),
                "cannot store a message received over HTTP; the sender will retry"
            );
            // 503 (the sender waits, spending nothing) only when the store is away or
            // busy; an error about this message (a value the database refuses) is a
            // 500: the sender spends an attempt, and in the end dead-letters it.
            let status = if e.is_transient() {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            reason(status, format!("cannot store the message now: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_exactly() {
        assert!(same_token(b"s3cret", b"s3cret"));
        assert!(!same_token(b"s3cre", b"s3cret"));
        assert!(!same_token(b"s3cretx", b"s3cret"));
        assert!(!same_token(b"s3creT", b"s3cret"));
        assert!(!same_token(b"", b"s3cret"));
        // A missing byte must not compare equal to a zero byte.
        assert!(!same_token(b"a", b"a\0"));
    }

    #[test]
    fn nonsense_is_refused() {
        assert!(ReceiverConfig::new("t").validate().is_ok());
        for bad in [
            ReceiverConfig::new(""),
            ReceiverConfig::new("  "),
            ReceiverConfig::new("t").max_body_bytes(0),
            ReceiverConfig::new("t").destinations(Vec::<String>::new()),
            ReceiverConfig::new("t").destinations(["a", ""]),
        ] {
            assert!(matches!(bad.validate(), Err(Error::Config(_))), "{bad:?}");
        }
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let mut headers = HeaderMap::new();
        assert!(!authorized(&headers, b"tok"));
        for (value, ok) in [
            ("Bearer tok", true),
            ("bearer tok", true),
            ("BEARER  tok ", true),
            ("Bearer tok2", false),
            ("Basic tok", false),
            ("Bearer", false),
            ("tok", false),
        ] {
            headers.insert(AUTHORIZATION, value.parse().unwrap());
            assert_eq!(authorized(&headers, b"tok"), ok, "{value}");
        }
    }
}
