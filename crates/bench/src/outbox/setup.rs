//! The outbox bench's settings and its messages: where they go, their keys and
//! payloads, the batch and lease of the claims; shared by the bench's parts and the
//! relay bench.

use std::time::Duration;

use agentsaga_core::Message;

/// Every message goes here.
pub(crate) const DEST: &str = "bench";
/// Distinct ordering keys, assigned round-robin.
pub(crate) const KEYS: usize = 1000;
/// Messages per batch transaction, and rows per claim.
pub(crate) const BATCH: usize = 100;
/// The claimer's lease owner name.
pub(super) const OWNER: &str = "bench-relay";
/// A lease long enough never to expire during a run.
pub(super) const LEASE: Duration = Duration::from_secs(600);
/// Messages per transaction when filling a backlog (untimed).
pub(super) const FILL_CHUNK: usize = 1000;

pub(crate) fn key(i: usize) -> String {
    format!("key-{:04}", i % KEYS)
}

pub(crate) fn payload(i: usize) -> serde_json::Value {
    serde_json::json!({ "order": i, "amount_cents": 4200, "currency": "EUR", "note": "bench" })
}

pub(super) fn message(i: usize) -> anyhow::Result<Message> {
    Ok(Message::to(DEST).key(key(i)).json(&payload(i))?)
}

/// Unix milliseconds, the SQLite schema's clock.
pub(crate) use agentsaga_core::clock::system_now_ms as now_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cycle_over_a_thousand() {
        assert_eq!(key(0), key(KEYS));
        assert_ne!(key(0), key(1));
    }
}
