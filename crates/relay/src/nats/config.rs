//! How a [`NatsReceiver`](super::NatsReceiver) consumes: its stream, its durable
//! consumer, the destinations it serves, and its batches.

use std::time::Duration;

use super::{DEFAULT_PREFIX, NatsError, is_subject, subject};

/// How a [`NatsReceiver`](super::NatsReceiver) consumes the stream.
///
/// ```
/// use std::time::Duration;
///
/// use agentsaga_relay::nats::NatsReceiverConfig;
///
/// let config = NatsReceiverConfig::new("AGENTSAGA", "payments-service")
///     .destinations(["payments", "refunds"])
///     .batch_size(50)
///     .ack_wait(Duration::from_secs(10));
/// assert_eq!(config.batch_size, 50);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NatsReceiverConfig {
    /// The stream to consume (it must exist and cover the destinations' subjects).
    pub stream: String,
    /// The name of the receiving service's durable consumers, one per destination:
    /// `<durable>_<destination>` (dots as `_`). Their positions in the stream survive
    /// restarts of the receiver and of the server.
    pub durable: String,
    /// The subject prefix, the sender's ([`DEFAULT_PREFIX`] unless set).
    pub prefix: String,
    /// The destinations served here: their subjects are consumed. Required.
    pub destinations: Vec<String>,
    /// At most this many messages per batch, stored in one transaction; also the
    /// consumer's `max_ack_pending` (default 100).
    pub batch_size: usize,
    /// How long the server waits for an acknowledgement before it redelivers (default
    /// 30 s). A receiver that starts and finds messages delivered but not
    /// acknowledged (its predecessor died holding them) waits this long before it
    /// fetches, so that they come back before any later message of their keys.
    pub ack_wait: Duration,
    /// How long one fetch waits for a first message before it asks again (default 5 s).
    pub fetch_wait: Duration,
}

impl NatsReceiverConfig {
    /// Consumes `stream` through the durable consumer `durable`: batches of 100, an
    /// ack wait of 30 s, no destination yet (set them with
    /// [`destinations`](Self::destinations)).
    pub fn new(stream: impl Into<String>, durable: impl Into<String>) -> Self {
        Self {
            stream: stream.into(),
            durable: durable.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            destinations: Vec::new(),
            batch_size: 100,
            ack_wait: Duration::from_secs(30),
            fetch_wait: Duration::from_secs(5),
        }
    }

    /// Sets [`destinations`](Self::destinations).
    #[must_use]
    pub fn destinations<I, S>(mut self, destinations: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.destinations = destinations.into_iter().map(Into::into).collect();
        self
    }

    /// Sets [`prefix`](Self::prefix).
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets [`batch_size`](Self::batch_size).
    #[must_use]
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Sets [`ack_wait`](Self::ack_wait).
    #[must_use]
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// Sets [`fetch_wait`](Self::fetch_wait).
    #[must_use]
    pub fn fetch_wait(mut self, fetch_wait: Duration) -> Self {
        self.fetch_wait = fetch_wait;
        self
    }

    /// The subjects of the destinations, or why this configuration cannot work.
    pub(crate) fn subjects(&self) -> Result<Vec<String>, NatsError> {
        let bad = |why: String| Err(NatsError::Config(why));
        let name_ok = |n: &str| is_subject(n) && !n.contains('.');
        if !name_ok(&self.stream) {
            return bad(format!(
                "stream name `{}` must be one token: not empty, no dot, space, `*` or `>`",
                self.stream
            ));
        }
        if !name_ok(&self.durable) {
            return bad(format!(
                "durable consumer name `{}` must be one token: not empty, no dot, space, \
                 `*` or `>`",
                self.durable
            ));
        }
        if !is_subject(&self.prefix) {
            return bad(format!(
                "prefix `{}` is not a NATS subject (tokens separated by dots, none empty, \
                 no space, `*` or `>`)",
                self.prefix
            ));
        }
        if self.destinations.is_empty() {
            return bad("no destinations: nothing would be received".into());
        }
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return bad(format!(
                "batch_size {} must be between 1 and 10000",
                self.batch_size
            ));
        }
        if self.ack_wait < Duration::from_secs(1) {
            return bad(format!("ack_wait {:?} is under 1 s", self.ack_wait));
        }
        if self.fetch_wait < Duration::from_millis(100) || self.fetch_wait >= self.ack_wait {
            return bad(format!(
                "fetch_wait {:?} must be at least 100 ms and under ack_wait {:?}",
                self.fetch_wait, self.ack_wait
            ));
        }
        let mut subjects = Vec::with_capacity(self.destinations.len());
        for (i, d) in self.destinations.iter().enumerate() {
            let s = subject(&self.prefix, d).map_err(NatsError::Config)?;
            if subjects.contains(&s) {
                return bad(format!("destination `{d}` is listed twice"));
            }
            let name = self.consumer_name(d);
            if let Some(other) = self.destinations[..i]
                .iter()
                .find(|o| self.consumer_name(o) == name)
            {
                return bad(format!(
                    "destinations `{other}` and `{d}` would share the consumer `{name}` \
                     (a dot in a destination is `_` in its consumer's name): rename one"
                ));
            }
            let right = super::right::name(&self.stream, &name);
            if right.len() > super::right::MAX_NAME {
                return bad(format!(
                    "destination `{d}`: the name of its right to receive, `{right:.60}…`, \
                     is over {} characters (non-ASCII characters take 6): shorten the \
                     destination or the durable name",
                    super::right::MAX_NAME
                ));
            }
            subjects.push(s);
        }
        Ok(subjects)
    }

    /// The durable consumer of `destination`: `<durable>_<destination>`, its dots as
    /// `_`.
    pub(crate) fn consumer_name(&self, destination: &str) -> String {
        format!("{}_{}", self.durable, destination.replace('.', "_"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonsense_is_refused() {
        let good = NatsReceiverConfig::new("S", "d").destinations(["a", "b.c"]);
        assert_eq!(good.subjects().unwrap(), ["agentsaga.a", "agentsaga.b.c"]);
        for bad in [
            good.clone().destinations(Vec::<String>::new()),
            good.clone().destinations(["a", "a"]),
            good.clone().destinations(["x", "pay.eu", "pay_eu"]),
            good.clone().destinations(["pay ments"]),
            good.clone().destinations(["pay.*"]),
            good.clone().destinations([""]),
            good.clone().destinations(["é".repeat(40)]),
            NatsReceiverConfig::new("", "d").destinations(["a"]),
            NatsReceiverConfig::new("S.T", "d").destinations(["a"]),
            NatsReceiverConfig::new("S", "d>").destinations(["a"]),
            good.clone().prefix("a..b"),
            good.clone().batch_size(0),
            good.clone().ack_wait(Duration::from_millis(10)),
            good.clone().fetch_wait(Duration::from_secs(60)),
        ] {
            assert!(
                matches!(bad.subjects(), Err(NatsError::Config(_))),
                "{bad:?}"
            );
        }
    }
}
