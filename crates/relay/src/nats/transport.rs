//! The sending side: a relay's transport that publishes each envelope to the stream
//! and reports it delivered on the stream's acknowledgement (see the module `nats`).

use std::fmt;
use std::time::Duration;

use agentsaga_core::Envelope;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishErrorKind};

use super::{DEFAULT_PREFIX, NatsConnect, NatsError, jetstream_at};
use crate::{Delivery, Transport};

/// Delivers envelopes by publishing them to a JetStream stream (see the module).
#[derive(Clone)]
pub struct NatsTransport {
    js: jetstream::Context,
    prefix: String,
    timeout: Duration,
}

impl fmt::Debug for NatsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsTransport")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl NatsTransport {
    /// Connects to the server as `to` says (a URL, `nats://127.0.0.1:4222`, or a
    /// [`NatsConnect`] with credentials and TLS), subjects under [`DEFAULT_PREFIX`].
    ///
    /// # Errors
    /// As [`NatsConnect::client`]: [`NatsError::Connect`] if the server cannot be
    /// reached or refuses the credentials.
    pub async fn connect(to: impl Into<NatsConnect>) -> Result<Self, NatsError> {
        Ok(Self::new(jetstream_at(&to.into()).await?))
    }

    /// A transport over an existing JetStream context.
    pub fn new(js: jetstream::Context) -> Self {
        Self {
            js,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: Duration::from_secs(10),
        }
    }

    /// Subjects under `prefix` instead of [`DEFAULT_PREFIX`].
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a publish waits for the stream's acknowledgement before it is
    /// retried (10 s unless set).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The subject of `destination`, or why it has none.
    ///
    /// # Errors
    /// The reason, for a destination that is not one NATS subject of tokens.
    pub fn subject(&self, destination: &str) -> Result<String, String> {
        super::subject(&self.prefix, destination)
    }

    /// Makes the stream `name` over every subject of this transport (`<prefix>.>`), with
    /// `duplicate_window` as its dedupe window, unless it exists (an existing one is
    /// used as it is).
    ///
    /// The stream is a work queue: a message stays until a consumer acknowledges it
    /// (however long its service is away), then leaves; and the server refuses a
    /// consumer whose subjects overlap another's, so a destination has one consuming
    /// service.
    ///
    /// # Errors
    /// [`NatsError::Stream`] if the server refuses it.
    pub async fn ensure_stream(
        &self,
        name: &str,
        duplicate_window: Duration,
    ) -> Result<(), NatsError> {
        self.js
            .get_or_create_stream(jetstream::stream::Config {
                name: name.to_owned(),
                subjects: vec![format!("{}.>", self.prefix)],
                duplicate_window,
                retention: jetstream::stream::RetentionPolicy::WorkQueue,
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|e| NatsError::Stream {
                stream: name.to_owned(),
                reason: e.to_string(),
            })
    }

    /// The consumers of `stream` with their lag, as the broker counts it (see
    /// [`consumer_lag`](super::consumer_lag)), destinations under this transport's
    /// prefix.
    ///
    /// # Errors
    /// [`NatsError::Stream`] if the stream cannot be read.
    pub async fn consumer_lag(&self, stream: &str) -> Result<Vec<super::ConsumerLag>, NatsError> {
        super::lag::lag_under(&self.js, stream, &self.prefix).await
    }
}

/// `s` as NATS carries it in a header: every byte that is not printable ASCII (`!` to
/// `~`), and `%` (in a name also `:`), written `%XX` (upper-case hex), so that any
/// percent-decoder gives `s` back. A header NATS carries as it is (`traceparent`, a
/// message id) is unchanged; one it cannot (a line break in a step name an LLM chose,
/// a space, non-ASCII) no longer makes the client panic. The envelope in the body holds
/// every header as it is: a receiver reads them from there.
///
/// A name that starts with `Nats-` (any case) has its first letter encoded too: such
/// headers are the server's instructions (`Nats-Rollup` would purge the stream), which
/// a saga's header must never give.
pub(crate) fn percent_encoded(s: &str, name: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len());
    let server_word = name && s.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("nats-"));
    for (i, b) in s.bytes().enumerate() {
        let plain = b.is_ascii_graphic() && b != b'%' && !(name && b == b':');
        if plain && !(server_word && i == 0) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `s` percent-decoded, as [`percent_encoded`] wrote it (a `%` not followed by two hex
/// digits is kept; bytes that are not UTF-8 become U+FFFD).
pub(crate) fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[async_trait::async_trait]
impl Transport for NatsTransport {
    async fn deliver(&self, envelope: &Envelope) -> Delivery {
        let subject = match self.subject(&envelope.destination) {
            Ok(s) => s,
            Err(why) => return Delivery::reject(why),
        };
        let payload = match serde_json::to_vec(envelope) {
            Ok(p) => p,
            Err(e) => return Delivery::reject(format!("the envelope does not encode: {e}")),
        };
        let mut headers = HeaderMap::new();
        for (k, v) in &envelope.headers {
            // An empty name has no place on the wire: the body's envelope keeps it.
            if !k.is_empty() {
                headers.insert(percent_encoded(k, true), percent_encoded(v, false));
            }
        }
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            envelope.id.to_string().as_str(),
        );
        let publish = async {
            let ack = self
                .js
                .publish_with_headers(subject, headers, payload.into())
                .await?;
            ack.await
        };
        match tokio::time::timeout(self.timeout, publish).await {
            Ok(Ok(_ack)) => Delivery::Delivered,
            Ok(Err(e)) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                Delivery::reject(format!("NATS refused the message: {e}"))
            }
            // The stream did not take it (the broker away, the connection broken, no
            // stream on the subject yet, too many unacknowledged publishes): the row
            // waits in the outbox however long that lasts, spending nothing.
            Ok(Err(e))
                if matches!(
                    e.kind(),
                    PublishErrorKind::BrokenPipe
                        | PublishErrorKind::TimedOut
                        | PublishErrorKind::StreamNotFound
                        | PublishErrorKind::MaxAckPending
                ) =>
            {
                Delivery::unavailable(format!("NATS publish: {e}"))
            }
            // The stream answered with an error about this message (too large for its
            // limits, say): an attempt spent, then a dead letter.
            Ok(Err(e)) => Delivery::retry(format!("NATS publish: {e}")),
            Err(_) => Delivery::unavailable(format!(
                "NATS publish: no acknowledgement from the stream within {:?}",
                self.timeout
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_round_trips() {
        for s in [
            "charge\nnow",
            "a\r\nb",
            "é ü",
            "100%",
            "a:b",
            "Nats-Rollup",
            "%4E",
            "",
        ] {
            for name in [true, false] {
                let wire = percent_encoded(s, name);
                assert!(
                    wire.bytes()
                        .all(|b| b.is_ascii_graphic() && !(name && b == b':')),
                    "{wire}"
                );
                assert_eq!(percent_decoded(&wire), s);
            }
        }
        assert_eq!(percent_decoded("50%"), "50%");
        assert_eq!(percent_decoded("%zz%4"), "%zz%4");
    }
}
