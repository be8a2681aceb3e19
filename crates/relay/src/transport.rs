//! The seam between the relay and a destination: what a delivery attempt answers.

use std::time::Duration;

use agentsaga_core::Envelope;

/// The outcome of one delivery attempt, as the transport saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The destination has the message: the row is marked delivered.
    Delivered,
    /// Not this time (destination down, timed out, busy): try again after `after`, or
    /// after the relay's [`RetryPolicy`](agentsaga_core::RetryPolicy) backoff if `None`.
    /// Counts against the attempt budget; once it is spent the message is
    /// dead-lettered with `reason`. Counts as a failure for the destination's circuit
    /// breaker.
    Retry {
        /// Why; kept as the row's `last_error`.
        reason: String,
        /// The destination's own idea of when to try again (e.g. `Retry-After`).
        after: Option<Duration>,
    },
    /// The way to the destination is down (a broker away, a service that refuses
    /// connections): nothing reached it. The row goes back to pending **without
    /// spending an attempt** (however long the outage, nothing is dead-lettered for
    /// it), its `last_error` is `unavailable: <reason>`, and the destination's circuit
    /// breaker counts it as a failure: once open, the destination is paused and probed
    /// one delivery at a time, the pause growing while the probes fail. Answer this only
    /// when the destination surely did not act on the message; when it may have, answer
    /// [`Delivery::Retry`].
    Unavailable {
        /// Why; kept as the row's `last_error` after `unavailable: `.
        reason: String,
        /// When to try again, if known; else after the relay's backoff for the row's
        /// attempt.
        after: Option<Duration>,
    },
    /// The destination will never take this message (undecodable, unknown type): it is
    /// dead-lettered at once.
    Reject {
        /// Why; kept as the row's `last_error` and sent in the `DeliveryFailed` notice.
        reason: String,
    },
}

impl Delivery {
    /// [`Delivery::Retry`] after the relay's own backoff.
    pub fn retry(reason: impl Into<String>) -> Self {
        Self::Retry {
            reason: reason.into(),
            after: None,
        }
    }

    /// [`Delivery::Retry`] no sooner than `after`.
    pub fn retry_after(reason: impl Into<String>, after: Duration) -> Self {
        Self::Retry {
            reason: reason.into(),
            after: Some(after),
        }
    }

    /// [`Delivery::Unavailable`] after the relay's own backoff.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self::Unavailable {
            reason: reason.into(),
            after: None,
        }
    }

    /// [`Delivery::Reject`].
    pub fn reject(reason: impl Into<String>) -> Self {
        Self::Reject {
            reason: reason.into(),
        }
    }

    /// `"delivered"`, `"retry"`, `"unavailable"` or `"reject"`: for logs and span
    /// fields.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Retry { .. } => "retry",
            Self::Unavailable { .. } => "unavailable",
            Self::Reject { .. } => "reject",
        }
    }
}

/// Hands an envelope to its destination. Implemented by the in-process transport
/// ([`InProcessTransport`](crate::in_process::InProcessTransport)) and by remote ones.
///
/// `deliver` runs on a delivery worker, never inside a database transaction, and may
/// take as long as it needs: the relay renews the row's lease meanwhile. A panic is
/// caught and treated as [`Delivery::Retry`].
///
/// ```
/// use agentsaga_core::Envelope;
/// use agentsaga_relay::{Delivery, Transport};
///
/// struct Stdout;
///
/// #[async_trait::async_trait]
/// impl Transport for Stdout {
///     async fn deliver(&self, envelope: &Envelope) -> Delivery {
///         println!("{} -> {}: {}", envelope.id, envelope.destination, envelope.payload);
///         Delivery::Delivered
///     }
/// }
/// ```
#[async_trait::async_trait]
pub trait Transport: Send + Sync + 'static {
    /// Delivers one envelope; the answer decides what happens to its row.
    async fn deliver(&self, envelope: &Envelope) -> Delivery;
}
