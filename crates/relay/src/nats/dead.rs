//! The dead letters of bad input: what a [`NatsReceiver`](super::NatsReceiver) writes
//! for a message it cannot store as it came, so that the operator sees it with its
//! reason. Each fits the store (its size limit, a JSON payload) whatever came in.

use agentsaga_core::{DeliveryFailed, Envelope, Headers, Message, MessageId, Store};

use super::{HEADER_STREAM_SEQ, HEADER_SUBJECT};

/// Where a message came from in the stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin<'a> {
    /// Its subject.
    pub(crate) subject: &'a str,
    /// The stream's name.
    pub(crate) stream: &'a str,
    /// Its sequence number in the stream.
    pub(crate) stream_seq: u64,
    /// Its `Nats-Msg-Id` header, if any.
    pub(crate) msg_id: Option<&'a str>,
}

impl Origin<'_> {
    /// The id of a dead letter without an envelope's: its `Nats-Msg-Id` if that is a
    /// message id, else one made from the stream and the sequence number, so that a
    /// redelivery of the same message is written once.
    fn id(&self) -> MessageId {
        if let Some(id) = self.msg_id.and_then(|s| s.parse().ok()) {
            return id;
        }
        // FNV-1a of the stream's name, then the sequence number.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.stream.bytes() {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&hash.to_be_bytes());
        bytes[8..].copy_from_slice(&self.stream_seq.to_be_bytes());
        uuid::Builder::from_custom_bytes(bytes).into_uuid().into()
    }

    fn headers(&self) -> Headers {
        [
            (HEADER_SUBJECT.to_owned(), self.subject.to_owned()),
            (HEADER_STREAM_SEQ.to_owned(), self.stream_seq.to_string()),
        ]
        .into_iter()
        .collect()
    }
}

fn headers_size(headers: &Headers) -> usize {
    headers.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// `text` as a JSON string of at most `budget` bytes (cut at a character boundary).
fn json_string(text: &str, budget: usize) -> String {
    let mut cut = text.len().min(budget);
    loop {
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let json = serde_json::Value::from(&text[..cut]).to_string();
        if json.len() <= budget || cut == 0 {
            return json;
        }
        // Escapes made it longer: cut by the excess (at least one byte) and try again.
        cut = cut.saturating_sub((json.len() - budget).max(1));
    }
}

/// The dead letter of a body that is no envelope: its text (lossy UTF-8) as a JSON
/// string, cut to `limit` bytes with the headers naming its origin.
pub(crate) fn raw(origin: Origin<'_>, destination: &str, body: &[u8], limit: usize) -> Message {
    let headers = origin.headers();
    let budget = limit.saturating_sub(headers_size(&headers));
    Message::to(destination)
        .id(origin.id())
        .raw_json(json_string(&String::from_utf8_lossy(body), budget))
        .headers(headers)
}

/// The dead letter of an envelope refused: its id, key and headers (with its origin's),
/// and its payload, kept as it is if it is JSON and fits in `limit` with the headers,
/// else as a JSON string of its text, cut to fit. Headers that alone would not leave
/// half the limit are replaced by the origin's only.
pub(crate) fn of_envelope(
    origin: Origin<'_>,
    destination: &str,
    envelope: &Envelope,
    limit: usize,
) -> Message {
    let mut headers = envelope.headers.clone();
    headers.extend(origin.headers());
    if headers_size(&headers) > limit / 2 {
        headers = origin.headers();
    }
    let budget = limit.saturating_sub(headers_size(&headers));
    let is_json = serde_json::from_str::<serde::de::IgnoredAny>(&envelope.payload).is_ok();
    let payload = if is_json && envelope.payload.len() <= budget {
        envelope.payload.clone()
    } else {
        json_string(&envelope.payload, budget)
    };
    let mut message = Message::to(destination)
        .id(envelope.id)
        .raw_json(payload)
        .headers(headers);
    if let Some(key) = &envelope.key {
        message = message.key(key.as_str());
    }
    message
}

/// The `DeliveryFailed` notice for `envelope`, dead-lettered on arrival for `why`, to
/// its `reply_to` (`None` without one): as the relay sends one for a message it gives
/// up on, so that the sender's saga learns of it as of a local dead letter (the notice
/// goes back over the broker to the service that waits). Its id is made from the
/// envelope's, so that a redelivery of the message writes it once. `None` (logged) if
/// even the notice does not fit the store.
pub(crate) fn notice(envelope: &Envelope, why: &str, store: &Store) -> Option<Message> {
    let mut notice = match DeliveryFailed::notice_for(envelope, why) {
        Ok(notice) => notice?,
        Err(e) => {
            tracing::error!(message.id = %envelope.id, error = %e, "cannot build the DeliveryFailed notice");
            return None;
        }
    };
    notice.id = notice_id(envelope.id);
    if let Err(e) = store.check_message(&notice) {
        tracing::error!(
            message.id = %envelope.id,
            reply_to = %notice.destination,
            error = %e,
            "the DeliveryFailed notice of a message dead-lettered on arrival does not fit \
             the store: its sender is not told"
        );
        return None;
    }
    Some(notice)
}

/// For a body that is no envelope: an envelope of its NATS headers (percent-decoded,
/// the server's own `Nats-…` left out), under the id of its dead letter, if they name
/// a `reply_to`, so that the one waiting for an answer is told (see [`notice`]).
pub(crate) fn envelope_of_headers(
    origin: Origin<'_>,
    destination: &str,
    nats: &async_nats::HeaderMap,
) -> Option<Envelope> {
    use super::transport::percent_decoded;
    let headers: Headers = nats
        .iter()
        .filter(|(k, _)| {
            let k: &str = k.as_ref();
            !k.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("nats-"))
        })
        .filter_map(|(k, v)| {
            let k: &str = k.as_ref();
            Some((percent_decoded(k), percent_decoded(v.first()?.as_str())))
        })
        .collect();
    headers
        .contains_key(agentsaga_core::header::REPLY_TO)
        .then(|| Envelope {
            seq: 0,
            id: origin.id(),
            destination: destination.to_owned(),
            key: None,
            payload: String::new(),
            headers,
            attempts: 0,
            created_at_ms: 0,
        })
}

/// The id of the notice about message `id`: its bytes with a fixed mask, as a UUID of
/// version 8 (never a message's own, which are version 7).
fn notice_id(id: MessageId) -> MessageId {
    let mut bytes = *id.as_uuid().as_bytes();
    for (b, m) in bytes.iter_mut().zip(b"agentsaga notice") {
        *b ^= m;
    }
    uuid::Builder::from_custom_bytes(bytes).into_uuid().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(msg_id: Option<&str>) -> Origin<'_> {
        Origin {
            subject: "agentsaga.pay",
            stream: "S",
            stream_seq: 42,
            msg_id,
        }
    }

    #[test]
    fn raw_bodies_fit_and_are_json() {
        let body = "\"quoted\"\u{1}é".repeat(1000);
        // The origin's headers take 42 bytes, an empty JSON string 2.
        for limit in [0, 44, 45, 50, 51, 100, 1000, 100_000] {
            let m = raw(origin(None), "pay", body.as_bytes(), limit);
            let size = m.payload.len() + headers_size(&m.headers);
            assert!(size <= limit.max(44), "{limit}: {size}");
            let text: String = serde_json::from_str(&m.payload).unwrap();
            assert!(body.starts_with(&text), "{limit}");
            if limit >= 100 {
                assert!(!text.is_empty(), "{limit}");
            }
        }
        let m = raw(origin(None), "pay", b"\xff{not json", 1000);
        assert_eq!(m.payload, "\"\u{fffd}{not json\"");
        assert_eq!(m.headers[HEADER_SUBJECT], "agentsaga.pay");
        assert_eq!(m.headers[HEADER_STREAM_SEQ], "42");
    }

    #[test]
    fn ids_are_stable() {
        let a = raw(origin(None), "pay", b"x", 100).id;
        assert_eq!(a, raw(origin(None), "pay", b"y", 100).id);
        let other = Origin {
            stream_seq: 43,
            ..origin(None)
        };
        assert_ne!(a, raw(other, "pay", b"x", 100).id);
        let id = MessageId::new();
        let given = id.to_string();
        assert_eq!(raw(origin(Some(&given)), "pay", b"x", 100).id, id);
        assert_eq!(raw(origin(Some("nope")), "pay", b"x", 100).id, a);
    }
}
