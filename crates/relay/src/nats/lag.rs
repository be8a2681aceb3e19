//! The broker's view of a stream's consumers: how far behind each service is
//! ([`consumer_lag`]). What the CLI's `agentsaga remote` and the console show beside
//! the outbox rows waiting on this side.

use async_nats::jetstream;
use futures_util::TryStreamExt;

use super::{DEFAULT_PREFIX, NatsError, is_subject};

/// What the broker says about one consumer of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerLag {
    /// The consumer's name (a [`NatsReceiver`](super::NatsReceiver)'s:
    /// `<service>_<destination, dots as _>`).
    pub consumer: String,
    /// Its filter subject (empty: the whole stream).
    pub filter_subject: String,
    /// The destination it serves: its filter subject under the prefix, or `None` for a
    /// filter that is not one destination (none, another prefix, a wildcard).
    pub destination: Option<String>,
    /// Messages in the stream not yet delivered to it (`num_pending`): published, not
    /// yet in the service's hands.
    pub pending: u64,
    /// Messages delivered to it and not acknowledged (`num_ack_pending`): in the
    /// service's hands, not yet stored there.
    pub ack_pending: u64,
    /// Of those, how many were delivered more than once (`num_redelivered`).
    pub redelivered: u64,
}

/// Every consumer of `stream`, by name, with its lag, for subjects under
/// [`DEFAULT_PREFIX`]. One request per page of consumers: it takes as long as the
/// server takes to answer; bound it with a timeout where that matters.
///
/// # Errors
/// [`NatsError::Stream`] if the stream cannot be read or its consumers listed.
pub async fn consumer_lag(
    js: &jetstream::Context,
    stream: &str,
) -> Result<Vec<ConsumerLag>, NatsError> {
    lag_under(js, stream, DEFAULT_PREFIX).await
}

/// [`consumer_lag`] for subjects under `prefix`.
pub(crate) async fn lag_under(
    js: &jetstream::Context,
    stream: &str,
    prefix: &str,
) -> Result<Vec<ConsumerLag>, NatsError> {
    let failed = |reason: String| NatsError::Stream {
        stream: stream.to_owned(),
        reason,
    };
    let s = js
        .get_stream(stream)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let infos: Vec<jetstream::consumer::Info> = s
        .consumers()
        .try_collect()
        .await
        .map_err(|e| failed(format!("listing its consumers: {e}")))?;
    let mut lags: Vec<ConsumerLag> = infos
        .into_iter()
        .map(|info| ConsumerLag {
            destination: destination_of(prefix, &info.config.filter_subject),
            filter_subject: info.config.filter_subject,
            consumer: info.name,
            pending: info.num_pending,
            ack_pending: info.num_ack_pending as u64,
            redelivered: info.num_redelivered as u64,
        })
        .collect();
    lags.sort_by(|a, b| a.consumer.cmp(&b.consumer));
    Ok(lags)
}

/// The destination of `filter`: what follows `<prefix>.`, if that is a subject without
/// wildcards.
fn destination_of(prefix: &str, filter: &str) -> Option<String> {
    let rest = filter.strip_prefix(prefix)?.strip_prefix('.')?;
    is_subject(rest).then(|| rest.to_owned())
}

#[cfg(test)]
mod tests {
    use super::destination_of;

    #[test]
    fn a_destination_is_a_plain_subject_under_the_prefix() {
        let d = |f| destination_of("agentsaga", f);
        assert_eq!(d("agentsaga.payments").as_deref(), Some("payments"));
        assert_eq!(
            d("agentsaga.saga.order.v1").as_deref(),
            Some("saga.order.v1")
        );
        for none in [
            "",
            "agentsaga",
            "agentsaga.",
            "agentsaga.>",
            "agentsaga.a.*",
            "other.a",
        ] {
            assert_eq!(d(none), None, "{none}");
        }
        assert_eq!(d("agentsagax.a"), None);
    }
}
