//! The outbox driven by hand: envelopes as the relay hands them over, claims, and a
//! relay loop, for tests that deliver without a relay.

use std::time::Duration;

use crate::queue::Claim;
use crate::{Envelope, MessageId, Store};

/// The owner the claims of [`claim`] and [`pump`] are leased to.
/// The relay name [`claim`] and [`pump`] claim rows as.
pub const OWNER: &str = "t";

/// An envelope to `destination` with `payload` (JSON text, not checked) and `headers`,
/// as the relay would hand it over, for tests that touch no store: row 1, a fresh id,
/// no ordering key, the first attempt, written at 0 ms. Other values with struct
/// update syntax:
///
/// ```
/// use agentsaga_core::Envelope;
/// use agentsaga_core::testing::envelope;
///
/// let env = Envelope {
///     attempts: 3,
///     ..envelope("billing", "null", [("reply_to", "orders")])
/// };
/// assert_eq!(env.header("reply_to"), Some("orders"));
/// ```
pub fn envelope<'a>(
    destination: &str,
    payload: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Envelope {
    Envelope {
        seq: 1,
        id: MessageId::new(),
        destination: destination.to_owned(),
        key: None,
        payload: payload.to_owned(),
        headers: headers
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect(),
        attempts: 1,
        created_at_ms: 0,
    }
}

/// Claims up to `limit` ready rows for `destinations`, leased to `t` for 60 s.
///
/// # Panics
/// If the claim fails.
pub async fn claim(store: &Store, destinations: &[String], limit: u32) -> Vec<Envelope> {
    let claim = Claim {
        owner: OWNER,
        destinations,
        limit,
        lease: Duration::from_secs(60),
    };
    store
        .queue()
        .claim(&claim)
        .await
        .unwrap_or_else(|e| panic!("agentsaga testing: claim failed: {e}"))
}

/// A relay driven by hand: until `done` holds, claims what is ready for `destinations`
/// (64 rows at a time, as [`claim`]), hands each batch to `deliver` and then marks it
/// delivered; when nothing is ready it sleeps 2 ms. `deliver` may reorder the batch.
///
/// # Panics
/// When `within` passes before `done` holds (naming `what`), or a claim or
/// acknowledgement fails.
pub async fn pump(
    store: &Store,
    destinations: &[String],
    what: &str,
    within: Duration,
    mut done: impl AsyncFnMut() -> bool,
    mut deliver: impl AsyncFnMut(&mut [Envelope]),
) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if done().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting until {what}"
        );
        let mut batch = claim(store, destinations, 64).await;
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        let seqs: Vec<i64> = batch.iter().map(|e| e.seq).collect();
        deliver(&mut batch).await;
        store
            .queue()
            .mark_delivered(OWNER, &seqs)
            .await
            .unwrap_or_else(|e| panic!("agentsaga testing: marking delivered failed: {e}"));
    }
}
