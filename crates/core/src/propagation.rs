//! Trace-context propagation hooks. The core knows nothing of OpenTelemetry: the
//! runtime's telemetry setup installs a [`Propagator`], and then every enqueue captures
//! the current span's context into the message's headers (`traceparent`), and every
//! consumer adopts it as the parent of its span. Without one installed, both are no-ops.

use std::sync::OnceLock;

use crate::message::header;
use crate::{Headers, Message, Result};

/// Moves trace context between the current span and message headers.
pub trait Propagator: Send + Sync + 'static {
    /// Writes the current span's context into `headers`.
    fn inject(&self, headers: &mut Headers);
    /// Makes the context in `headers` the parent of `span` (before it is entered).
    fn adopt(&self, span: &tracing::Span, headers: &Headers);
}

static PROPAGATOR: OnceLock<Box<dyn Propagator>> = OnceLock::new();

/// Installs the process-wide propagator; `false` if one was installed already.
pub fn set_propagator(p: impl Propagator) -> bool {
    PROPAGATOR.set(Box::new(p)).is_ok()
}

/// Writes the current span's context into `headers` (overwriting any there).
pub fn inject_current(headers: &mut Headers) {
    if let Some(p) = PROPAGATOR.get() {
        p.inject(headers);
    }
}

/// The current span's context as a W3C `traceparent`, if a propagator is installed
/// and the span is traced: what a saga keeps to continue its trace later.
pub fn current_traceparent() -> Option<String> {
    let mut headers = Headers::new();
    inject_current(&mut headers);
    headers.remove(header::TRACEPARENT)
}

/// Makes the context carried by `headers` the parent of `span`.
pub fn adopt(span: &tracing::Span, headers: &Headers) {
    if let Some(p) = PROPAGATOR.get() {
        p.adopt(span, headers);
    }
}

/// The headers to store for a message: its own, plus the current trace context unless
/// the caller set one. Captured at enqueue time, inside the producer's span.
pub(crate) fn outgoing(headers: &Headers) -> Option<Headers> {
    let p = PROPAGATOR.get()?;
    if headers.contains_key(header::TRACEPARENT) {
        return None;
    }
    let mut h = headers.clone();
    p.inject(&mut h);
    Some(h)
}

/// Gives `messages`, produced under the current span, the trace context of an
/// `outbox.enqueue` span of their own, a child of the current span: for a producer that
/// enqueues the messages of several traces in one batch (one statement for many sagas'
/// first commands), so that each keeps its own trace, shaped as if enqueued alone. The
/// batch's enqueue then leaves their context as it is. Without a propagator installed,
/// a no-op.
pub fn stamp_enqueue(messages: &mut [Message]) {
    let Some(p) = PROPAGATOR.get() else {
        return;
    };
    if messages.is_empty() {
        return;
    }
    let span = enqueue_span(messages, false);
    let _entered = span.enter();
    for m in messages {
        p.inject(&mut m.headers);
    }
}

/// The producer span of an enqueue of `messages` (`handed_over`: written leased for
/// direct handover). It names their saga only if they all have the same one and none
/// carries a trace context already: such a message's producer span is elsewhere
/// ([`propagation::stamp_enqueue`](crate::propagation::stamp_enqueue)), and this span,
/// in no saga's trace, must not claim one.
pub(crate) fn enqueue_span(messages: &[Message], handed_over: bool) -> tracing::Span {
    let Some(first) = messages.first() else {
        return tracing::Span::none();
    };
    let span = tracing::info_span!(
        "outbox.enqueue",
        otel.kind = "producer",
        message.destination = %first.destination,
        message.id = %first.id,
        messages = messages.len(),
        handed_over,
        saga.id = tracing::field::Empty,
    );
    let saga = first.headers.get(crate::header::SAGA_ID);
    if let Some(saga) = saga
        && messages.iter().all(|m| {
            m.headers.get(crate::header::SAGA_ID) == Some(saga)
                && !m.headers.contains_key(crate::header::TRACEPARENT)
        })
    {
        span.record("saga.id", saga.as_str());
    }
    span
}

impl Message {
    /// The headers to store, as JSON: [`outgoing`] ones if a propagator adds a context.
    pub(crate) fn headers_json(&self) -> Result<String> {
        match outgoing(&self.headers) {
            Some(with_context) => Ok(serde_json::to_string(&with_context)?),
            None => Ok(serde_json::to_string(&self.headers)?),
        }
    }
}
