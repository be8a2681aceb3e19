//! What the claimer is told, by the relay, the pacer, the workers and the handover.

use agentsaga_core::Envelope;
use ractor::RpcReplyPort;

use crate::Delivery;

/// What the claimer is told.
pub(crate) enum ClaimerMsg {
    /// New rows may be ready (wakeup or poll tick): claim for the free workers.
    Tick,
    /// A worker finished a delivery.
    Done(Done),
    /// Rows committed leased to this relay (direct handover), their leases begun at the
    /// instant given (their insert, in the producer's transaction): deliver them as
    /// claimed, fenced from that instant.
    Adopt(Vec<Envelope>, tokio::time::Instant),
    /// Write the collected outcomes, then claim (acknowledgements and claim in one
    /// call).
    Flush,
    /// Extend the leases of rows this relay still holds.
    Renew,
    /// Return rows with expired leases to the pool.
    Reclaim,
    /// Stop claiming, drain, release, stop; answer when done.
    Shutdown(Option<RpcReplyPort<()>>),
    /// The drain took too long: release what is left.
    ShutdownDeadline,
}

/// A worker's report.
pub(crate) struct Done {
    pub(crate) seq: i64,
    /// Which delivery of the row this was (see [`Delivering`](super::delivering::Delivering)).
    pub(crate) number: u64,
    pub(crate) delivery: Delivery,
    /// When the delivery finished, Unix milliseconds (for the latency).
    pub(crate) finished_ms: i64,
}
