//! What the operator's calls ([`admin`](crate::admin)) count, read and delete.

use crate::Envelope;

/// Outbox counts and lag.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Rows waiting for delivery (timers included).
    pub pending: u64,
    /// Rows claimed by a relay.
    pub in_flight: u64,
    /// Rows delivered and not yet pruned.
    pub delivered: u64,
    /// Dead letters.
    pub dead: u64,
    /// Of the pending rows, those waiting for a destination that could not be reached
    /// (a broker away: their `last_error` starts `unavailable:`). They spend no
    /// attempts while they wait.
    pub unavailable: u64,
    /// How long the oldest ready pending row has been waiting past its `available_at`
    /// (the relay's lag), in milliseconds.
    pub oldest_pending_age_ms: Option<u64>,
}

/// One destination's rows waiting in the outbox
/// ([`Admin::waiting_by_destination`](crate::admin::Admin::waiting_by_destination)).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DestinationRows {
    /// The destination.
    pub destination: String,
    /// Its rows waiting for delivery (timers included).
    pub pending: u64,
    /// Its rows claimed by a relay.
    pub in_flight: u64,
    /// Of its pending rows, those waiting because it could not be reached (see
    /// [`Stats::unavailable`]).
    pub unavailable: u64,
    /// Why it could not be reached, as one of those rows says (the greatest reason,
    /// text order).
    pub unavailable_reason: Option<String>,
}

/// A dead letter as the operator sees it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeadRow {
    /// The message.
    pub envelope: Envelope,
    /// Why it died.
    pub last_error: Option<String>,
}

/// Which dead letters [`Admin::dead_letters_page`](crate::admin::Admin::dead_letters_page) reads: newest first, at most
/// `limit` rows and (but for a first row larger than that) `max_bytes` of payloads,
/// headers and errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadQuery<'a> {
    /// Only dead letters to this destination.
    pub destination: Option<&'a str>,
    /// Only dead letters older than this outbox seq (the last row of the page before).
    pub before_seq: Option<i64>,
    /// At most this many rows.
    pub limit: u32,
    /// At most this many bytes of payloads, headers and errors: the page stops after
    /// the row that reaches it (one row at least).
    pub max_bytes: usize,
}

impl Default for DeadQuery<'_> {
    fn default() -> Self {
        Self {
            destination: None,
            before_seq: None,
            limit: 100,
            max_bytes: usize::MAX,
        }
    }
}

/// What retention deletes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Table {
    /// Outbox rows delivered (by `delivered_at`).
    Delivered,
    /// Outbox dead letters (by `created_at`).
    Dead,
    /// Inbox records (by `received_at`).
    Inbox,
}
