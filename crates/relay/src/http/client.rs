//! The sending side: a [`Transport`] that POSTs envelopes to per-destination URLs.

use std::collections::HashMap;
use std::error::Error as _;
use std::fmt;
use std::time::Duration;

use agentsaga_core::Envelope;
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use reqwest::{StatusCode, Url};

use crate::{Delivery, Transport};

/// At most this many characters of an error answer's body go into the reason.
const MAX_REASON_BODY_CHARS: usize = 500;
/// Bytes of an error answer's body read at most (enough for the characters above).
const MAX_REASON_BODY_BYTES: usize = 4 * MAX_REASON_BODY_CHARS;
/// A `Retry-After` longer than this is cut to it.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Delivers envelopes to other processes by POSTing them to the
/// [`router`](super::router) of their receiving side.
///
/// Each destination is routed to one URL, the receiver's [`OUTBOX_PATH`](super::OUTBOX_PATH)
/// (e.g. `http://billing:8080/outbox`). The envelope goes as JSON
/// (`Content-Type: application/json`) with `Authorization: Bearer <token>`; the answer
/// decides the row's fate:
///
/// | answer | outcome |
/// | --- | --- |
/// | 2xx | [`Delivery::Delivered`] |
/// | 429, 503, connection refused (the service is away or says "not now": it did not act) | [`Delivery::Unavailable`]: no attempt spent, however long it lasts; no sooner than the `Retry-After` seconds if given (at most an hour) |
/// | 408, other 5xx, other statuses, timeout, connection reset | [`Delivery::Retry`] |
/// | other 4xx | [`Delivery::Reject`]: dead-lettered at once |
/// | a destination with no route, or a route that is not an `http://` URL | [`Delivery::Reject`] |
///
/// Reasons name the status and carry the start of the answer's body (up to 500
/// characters), and end up in the row's `last_error`.
///
/// One `reqwest` client, built without TLS (`http://` only), is shared by all deliveries
/// and by clones; it keeps connections alive between deliveries, follows no redirects,
/// and ignores the proxy environment variables (it talks to the routes directly).
///
/// ```
/// use std::time::Duration;
/// use agentsaga_relay::http::HttpTransport;
///
/// let transport = HttpTransport::new("s3cret")
///     .route("billing", "http://billing:8080/outbox")
///     .route("shipping", "http://10.0.0.7:8080/outbox")
///     .timeout(Duration::from_secs(5));
/// assert_eq!(transport.destinations(), ["billing", "shipping"]);
/// ```
#[derive(Clone)]
pub struct HttpTransport {
    client: reqwest::Client,
    token: String,
    routes: HashMap<String, Result<Url, String>>,
    timeout: Duration,
}

impl fmt::Debug for HttpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let routes: HashMap<&str, String> = self
            .routes
            .iter()
            .map(|(d, url)| {
                let url = match url {
                    Ok(url) => url.to_string(),
                    Err(e) => format!("invalid: {e}"),
                };
                (d.as_str(), url)
            })
            .collect();
        f.debug_struct("HttpTransport")
            .field("token", &"<redacted>")
            .field("routes", &routes)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpTransport {
    /// A transport with no routes yet, sending `token` as the bearer token (the one the
    /// receivers are configured with), with a 10 s timeout per delivery.
    ///
    /// An empty token is sent as no `Authorization` header at all, which receivers
    /// answer with 401: every delivery is then rejected.
    ///
    /// # Panics
    /// Only if `reqwest` cannot build a client, as [`reqwest::Client::new`] would:
    /// possible only when another crate of the program enables a TLS backend in
    /// `reqwest` and that backend cannot be initialised.
    pub fn new(token: impl Into<String>) -> Self {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .expect("a reqwest client without TLS options can always be built");
        Self {
            client,
            token: token.into(),
            routes: HashMap::new(),
            timeout: Duration::from_secs(10),
        }
    }

    /// Sends the messages of `destination` to `url`, the receiver's
    /// [`OUTBOX_PATH`](super::OUTBOX_PATH) (e.g. `http://billing:8080/outbox`). A later
    /// route for the same destination replaces the earlier one.
    ///
    /// A `url` that does not parse or is not `http://` is kept as such: the messages of
    /// `destination` are then rejected with the reason.
    #[must_use]
    pub fn route(mut self, destination: impl Into<String>, url: impl AsRef<str>) -> Self {
        let url = url.as_ref();
        let parsed = match Url::parse(url) {
            Ok(parsed) if parsed.scheme() == "http" => Ok(parsed),
            Ok(_) => Err(format!(
                "`{url}` is not an http:// URL (the HTTP transport has no TLS)"
            )),
            Err(e) => Err(format!("`{url}` is not a valid URL: {e}")),
        };
        self.routes.insert(destination.into(), parsed);
        self
    }

    /// How long one delivery (connecting, sending the envelope, reading the answer) may
    /// take before it counts as a retry (default 10 s).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The routed destinations, sorted: what to pass to
    /// [`Relay::start`](crate::Relay::start).
    pub fn destinations(&self) -> Vec<String> {
        let mut names: Vec<String> = self.routes.keys().cloned().collect();
        names.sort();
        names
    }
}

#[async_trait::async_trait]
impl Transport for HttpTransport {
    async fn deliver(&self, envelope: &Envelope) -> Delivery {
        let destination = &envelope.destination;
        let url = match self.routes.get(destination) {
            None => return Delivery::reject(format!("no route for destination {destination}")),
            Some(Err(e)) => {
                return Delivery::reject(format!("bad route for destination {destination}: {e}"));
            }
            Some(Ok(url)) => url,
        };
        let body = match serde_json::to_vec(envelope) {
            Ok(body) => body,
            Err(e) => return Delivery::reject(format!("cannot encode the envelope: {e}")),
        };
        let mut request = self
            .client
            .post(url.clone())
            .header(CONTENT_TYPE, "application/json")
            .timeout(self.timeout)
            .body(body);
        if !self.token.is_empty() {
            request = request.bearer_auth(&self.token);
        }
        match request.send().await {
            Ok(response) => outcome(destination, url, response).await,
            Err(e) => failure(destination, url, self.timeout, &e),
        }
    }
}

/// What an answer means.
async fn outcome(destination: &str, url: &Url, response: reqwest::Response) -> Delivery {
    let status = response.status();
    if status.is_success() {
        return Delivery::Delivered;
    }
    let after = match status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
            retry_after(response.headers())
        }
        _ => None,
    };
    let body = body_excerpt(response).await;
    let reason = if body.is_empty() {
        format!("{url} (destination {destination}) answered {status}")
    } else {
        format!("{url} (destination {destination}) answered {status}: {body}")
    };
    let permanent = status.is_client_error()
        && status != StatusCode::REQUEST_TIMEOUT
        && status != StatusCode::TOO_MANY_REQUESTS;
    let away = matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    );
    match after {
        _ if permanent => Delivery::reject(reason),
        after if away => Delivery::Unavailable { reason, after },
        Some(after) => Delivery::retry_after(reason, after),
        None => Delivery::retry(reason),
    }
}

/// What a failed exchange (no answer) means.
fn failure(destination: &str, url: &Url, timeout: Duration, e: &reqwest::Error) -> Delivery {
    let chain = error_chain(e);
    if e.is_builder() {
        Delivery::reject(format!(
            "cannot build the request to {url} (destination {destination}): {chain}"
        ))
    } else if e.is_timeout() {
        Delivery::retry(format!(
            "{url} (destination {destination}) did not answer within {timeout:?}: {chain}"
        ))
    } else if e.is_connect() {
        Delivery::unavailable(format!(
            "cannot connect to {url} (destination {destination}): {chain}"
        ))
    } else {
        Delivery::retry(format!(
            "request to {url} (destination {destination}) failed: {chain}"
        ))
    }
}

/// `Retry-After` in (non-negative, integer) seconds; an HTTP date is not understood.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

/// The start of an answer's body, for a reason: at most 500 characters, trimmed.
async fn body_excerpt(mut response: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < MAX_REASON_BODY_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    truncate(
        String::from_utf8_lossy(&bytes).trim(),
        MAX_REASON_BODY_CHARS,
    )
}

/// `text` cut to `max` characters, with an ellipsis if it was cut.
fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// The error and its sources, `: `-separated (reqwest's own message names no cause).
fn error_chain(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    #[test]
    fn truncates_on_char_boundaries() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("exactly", 7), "exactly");
        assert_eq!(truncate("ééééé", 3), "ééé…");
        let long = "x".repeat(2000);
        assert_eq!(truncate(&long, 500).chars().count(), 501);
    }

    #[test]
    fn retry_after_is_seconds_capped_at_an_hour() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static(" 7 "));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("99999999"));
        assert_eq!(retry_after(&headers), Some(MAX_RETRY_AFTER));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("-1"));
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn routes_must_be_http_urls() {
        let t = HttpTransport::new("t")
            .route("a", "http://127.0.0.1:1/outbox")
            .route("b", "https://example.invalid/outbox")
            .route("c", "not a url");
        assert!(t.routes["a"].is_ok());
        assert!(t.routes["b"].as_ref().unwrap_err().contains("no TLS"));
        assert!(
            t.routes["c"]
                .as_ref()
                .unwrap_err()
                .contains("not a valid URL")
        );
        assert_eq!(t.destinations(), ["a", "b", "c"]);
        let debug = format!("{:?}", HttpTransport::new("s3cret"));
        assert!(!debug.contains("s3cret"), "{debug}");
    }
}
