//! (feature `nats`) NATS JetStream between services, each with its own database (issue
//! 36): [`NatsTransport`] publishes a relay's envelopes to a stream, and
//! [`NatsReceiver`] consumes them into the receiving service's own outbox.
//!
//! The wire format, for a service in any language:
//! - **Subject**: `<prefix>.<destination>` (prefix `agentsaga` by default). A destination
//!   that is not one NATS token chain (empty, or holding a space, a control character,
//!   `*` or `>`) is refused:
//!   the sender dead-letters the message with the reason, a receiver's configuration
//!   naming one is an error.
//! - **Payload**: the envelope ([`agentsaga_core::Envelope`]) as JSON (`seq`, `id`,
//!   `destination`, `key`, `payload`, `headers`, `attempts`, `created_at_ms`), as the
//!   HTTP transport sends it. Its `destination` is the one of its subject.
//! - **Headers**: the message's own headers (`traceparent`, the saga's id and step, the
//!   idempotency key…), and `Nats-Msg-Id` set to the message id: JetStream drops a
//!   second publish of the same id within the stream's duplicate window. What NATS
//!   cannot carry as it is (a line break, a space, non-ASCII, `:` in a name) is
//!   percent-encoded there, and so is the first letter of a name starting with
//!   `Nats-` (no header gives the server an instruction); an empty name is left out.
//!   The envelope in the body holds every header as it is: a receiver reads those.
//! - **Sending**: the row is marked delivered only once the stream acknowledged the
//!   publish (a duplicate's acknowledgement counts: the stream has it). The stream
//!   must exist and cover the subjects ([`NatsTransport::ensure_stream`] makes one);
//!   without it a publish is retried.
//! - **Receiving** ([`NatsReceiver`]): a durable pull consumer per destination, over its
//!   subject (explicit acks, never given up: `max_deliver` -1, at most a batch
//!   unacknowledged). One task per consumer fetches batches in stream order (one pull
//!   request at a time) and stores each batch in **one transaction** of the local
//!   store: every good message enqueued with the envelope's id, key, payload and
//!   headers (an id already stored is a no-op, so a redelivery or a second publish is
//!   stored once), every bad one dead-lettered with its reason. Only after the commit
//!   is each message acknowledged (`+ACK`, confirmed by the server; a bad one `+TERM`).
//!   If the store fails (a database error, the outbox full), the batch is nak'ed at
//!   once, without a delay (the server then redelivers it before anything later; a
//!   delayed nak would let later messages of its keys pass it), and the receiver waits
//!   its backoff before it fetches again: nothing after the batch is stored before it.
//!   A receiver that finds messages delivered but not acknowledged (its predecessor
//!   died holding them) waits `ack_wait` for their redelivery before it fetches. A
//!   batch goes on as long as its messages keep coming, however slow the link (at most
//!   about 1 MiB per request); a fetch that ends before the server ended it (nothing
//!   came for `ack_wait`, the link cut) stores what came, a prefix in stream order,
//!   and waits out `ack_wait` for the rest, which the server redelivers before
//!   anything new, before it fetches again (`ReceiverStats::cut_fetches`). The
//!   local outbox so holds each key's messages in the publisher's order, and its relay
//!   delivers them to the local agents, whose inbox makes their processing effectively
//!   once. A lost acknowledgement means a redelivery, which the id makes harmless.
//! - **Bad input** is never dropped: an envelope that is not JSON, whose destination
//!   is not its subject's or not received here, whose payload is not JSON or is too
//!   large for the store, is written to the local dead letters with the reason
//!   (`agentsaga dead list`), with the headers [`HEADER_SUBJECT`] and
//!   [`HEADER_STREAM_SEQ`], and terminated (`+TERM`) after the commit. An envelope
//!   keeps its id, key and headers, and its payload if that is JSON and fits (else its
//!   text as a JSON string, cut to fit); a body that is no envelope is kept as a JSON
//!   string of its text, cut to the store's size limit, under its `Nats-Msg-Id` if that
//!   is a message id, else an id made from the stream and the sequence number (a
//!   redelivery is written once). (Only a store whose size limit
//!   cannot hold even those headers, under 100 bytes, loses it: logged as an error.)
//!   An envelope dead-lettered so that has a `reply_to` header (a saga's command) is
//!   answered as the relay answers a local dead letter: a `DeliveryFailed` notice to
//!   its `reply_to`, in the same transaction (its id made from the message's, so a
//!   redelivery writes it once), which the service's relay publishes back; the
//!   sender's saga fails the step with the reason and compensates, at once. A body
//!   that is no envelope is answered so if its NATS headers (percent-decoded) name a
//!   `reply_to`.

mod batch;
mod config;
mod connect;
mod counters;
mod dead;
mod lag;
mod receiver;
mod right;
mod transport;
mod worker;

pub use config::NatsReceiverConfig;
pub use connect::NatsConnect;
pub use counters::ReceiverStats;
pub use lag::{ConsumerLag, consumer_lag};
pub use receiver::NatsReceiver;
pub use transport::NatsTransport;

/// The subject prefix unless one is given.
pub const DEFAULT_PREFIX: &str = "agentsaga";

/// The header of a dead letter written by [`NatsReceiver`] that names the NATS subject
/// the message came on.
pub const HEADER_SUBJECT: &str = "nats_subject";

/// The header of a dead letter written by [`NatsReceiver`] that holds the message's
/// sequence number in its stream.
pub const HEADER_STREAM_SEQ: &str = "nats_stream_seq";

/// Why a NATS transport or receiver could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// The server could not be reached, refused the credentials (`authorization
    /// violation`) or failed the TLS handshake.
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        /// Where: the URL without its password or token ([`NatsConnect::shown`]).
        url: String,
        /// The client's error.
        source: async_nats::ConnectError,
    },
    /// The stream could not be made or read.
    #[error("JetStream stream `{stream}`: {reason}")]
    Stream {
        /// Its name.
        stream: String,
        /// The server's or client's answer.
        reason: String,
    },
    /// The receiver's consumer could not be made or read.
    #[error("JetStream consumer `{consumer}` on stream `{stream}`: {reason}")]
    Consumer {
        /// The stream's name.
        stream: String,
        /// The durable consumer's name.
        consumer: String,
        /// The server's or client's answer.
        reason: String,
    },
    /// A file of the connection's credentials or TLS could not be read or used (its
    /// path is shown, never its contents).
    #[error("NATS {what} `{}`: {reason}", path.display())]
    Credentials {
        /// Which: `credentials file`, `CA file`, `client certificate`, `client key`.
        what: &'static str,
        /// Its path.
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// The receiver's configuration cannot work.
    #[error("invalid NATS receiver configuration: {0}")]
    Config(String),
}

/// A JetStream context on a connection made as `to` says.
///
/// # Errors
/// As [`NatsConnect::client`].
pub(crate) async fn jetstream_at(
    to: &NatsConnect,
) -> Result<async_nats::jetstream::Context, NatsError> {
    Ok(async_nats::jetstream::new(to.client().await?))
}

/// The subject of `destination` under `prefix`, or why it has none.
pub(crate) fn subject(prefix: &str, destination: &str) -> Result<String, String> {
    if !is_subject(destination) {
        return Err(format!(
            "destination `{destination}` is not a NATS subject (tokens separated by \
             dots, none empty, no space, control character, `*` or `>`)"
        ));
    }
    Ok(format!("{prefix}.{destination}"))
}

/// Whether `s` is a chain of NATS subject tokens without wildcards (no whitespace or
/// control character either: the server would not route it to the stream).
pub(crate) fn is_subject(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|t| {
            !t.is_empty()
                && !t.contains(['*', '>'])
                && !t.contains(|c: char| c.is_whitespace() || c.is_control())
        })
}
