//! The relay bench's shared settings: the offered load, the relay's configuration, the
//! sizes of a run and the `relay-child` subcommand's arguments, for the bench's driver
//! and its latency runs alike.

use std::time::Duration;

use agentsaga_relay::RelayConfig;

use crate::outbox::BATCH;

/// Offered load of the latency runs, msgs/s.
pub(super) const RATE: f64 = 1000.0;
/// The relay's fallback poll period (its default): wakeups should make it moot.
pub(super) const POLL: Duration = Duration::from_millis(250);
/// How long deliveries may trail the producer before the run is called failed.
pub(super) const GRACE: Duration = Duration::from_secs(60);

/// The hidden `relay-child` subcommand: a relay alone against `url`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ChildArgs {
    /// The PostgreSQL database the parent produces into.
    #[arg(long)]
    pub(super) url: String,
    /// How many messages the parent sends.
    #[arg(long)]
    pub(super) count: usize,
    /// How long the parent produces, in seconds (the child gives up [`GRACE`] later).
    #[arg(long)]
    pub(super) seconds: f64,
    /// Delivery workers.
    #[arg(long, default_value_t = 8)]
    pub(super) workers: usize,
}

/// How much work each figure does.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizes {
    /// Backlog rows drained per round.
    pub(super) backlog: usize,
    /// Drain rounds per side (the median is reported).
    pub(super) rounds: usize,
    /// Seconds of production at [`RATE`] per latency run.
    pub(super) latency_secs: f64,
}

impl Sizes {
    pub(super) fn new(quick: bool) -> Self {
        if quick {
            Self {
                backlog: 10_000,
                rounds: 1,
                latency_secs: 3.0,
            }
        } else {
            Self {
                backlog: 100_000,
                rounds: 2,
                latency_secs: 10.0,
            }
        }
    }

    pub(super) fn messages(self) -> usize {
        (self.latency_secs * RATE) as usize
    }
}

pub(super) fn relay_config(workers: usize) -> RelayConfig {
    RelayConfig::default()
        .batch_size(BATCH as u32)
        .workers(workers)
        .poll_interval(POLL)
}
