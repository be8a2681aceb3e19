//! What the relay's protocol ([`queue`](crate::queue)) takes: a claim, a retry, a dead
//! letter.

use std::time::Duration;

use crate::Message;

/// A batch claim: up to `limit` ready rows for `destinations`, leased to `owner`.
#[derive(Debug, Clone)]
pub struct Claim<'a> {
    /// Who holds the lease (a relay instance id).
    pub owner: &'a str,
    /// Only rows for these destinations.
    pub destinations: &'a [String],
    /// At most this many rows.
    pub limit: u32,
    /// The lease length; an expired lease returns the row to the pool.
    pub lease: Duration,
}

/// A failed delivery to try again later.
#[derive(Debug, Clone)]
pub struct Retry {
    /// The row.
    pub seq: i64,
    /// Not before this delay.
    pub delay: Duration,
    /// The error, kept as `last_error`.
    pub error: String,
    /// Whether the attempt counts against the row's budget: `false` when the
    /// destination could not be reached at all (a broker away), so that an outage of
    /// any length spends nothing.
    pub spent: bool,
}

/// A message given up on.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The row.
    pub seq: i64,
    /// Why, kept as `last_error`.
    pub reason: String,
    /// A notice to enqueue in the same transaction (the `DeliveryFailed` to `reply_to`).
    pub notice: Option<Message>,
}
