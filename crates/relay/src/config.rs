//! The relay's configuration.

use std::collections::HashMap;
use std::time::Duration;

use agentsaga_core::RetryPolicy;

use crate::{Error, Result};

/// How a relay claims, delivers and gives up.
///
/// Build it from [`Default`] with the by-value setters:
///
/// ```
/// use std::time::Duration;
/// use agentsaga_relay::RelayConfig;
///
/// let config = RelayConfig::default()
///     .workers(16)
///     .lease(Duration::from_secs(10))
///     .owner("relay-eu-1");
/// assert_eq!(config.workers, 16);
/// assert_eq!(config.batch_size, 100);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    /// At most this many rows per claim (default 100).
    pub batch_size: u32,
    /// Delivery workers, i.e. deliveries in flight at once (default 8). The relay holds
    /// at most `workers + batch_size` claimed rows (the busy workers' and a batch queued
    /// behind them); the rest of the backlog stays in the outbox for other relays.
    pub workers: usize,
    /// Per-destination caps on rows in flight (claimed and not yet answered), for
    /// destinations that can only take so many at once (an agent with a bounded
    /// concurrency). A destination at its cap is left out of claims until one of its
    /// rows is answered; one claim may overshoot a cap by at most `batch_size`.
    /// Destinations not named here are bounded by `workers` alone.
    pub destination_limits: HashMap<String, usize>,
    /// How long a claim holds a row (default 30 s). Leases of rows still being delivered
    /// are renewed every `lease / 3`; a relay that dies loses its rows after `lease`, and
    /// live relays return them to the pool (checked every `lease / 2`).
    pub lease: Duration,
    /// Fallback poll period when no wakeup arrives (default 250 ms).
    pub poll_interval: Duration,
    /// Backoff and attempt budget of failed deliveries (default [`RetryPolicy::default`]).
    pub retry: RetryPolicy,
    /// Consecutive failed deliveries to one destination that open its circuit breaker
    /// (default 5; 0 disables the breaker).
    pub breaker_threshold: u32,
    /// How long an open breaker keeps its destination out of claims before one probe
    /// delivery is let through (default 5 s).
    pub breaker_cooldown: Duration,
    /// How long a graceful shutdown waits for deliveries in flight (default 10 s).
    pub shutdown_timeout: Duration,
    /// The lease owner written on claimed rows (default `relay-<uuid v7>`); unique per
    /// running relay.
    pub owner: String,
    /// Direct handover (default off): messages for this relay's destinations are
    /// written leased to it by the transaction that enqueues them (up to each
    /// destination's cap, or `workers`, handed over and unfinished) and handed to it on
    /// commit, with no claim. For a relay whose destinations are served in this process;
    /// see `agentsaga_core::handover::Handover`.
    pub handover: bool,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: 100,
            workers: 8,
            destination_limits: HashMap::new(),
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(250),
            retry: RetryPolicy::default(),
            breaker_threshold: 5,
            breaker_cooldown: Duration::from_secs(5),
            shutdown_timeout: Duration::from_secs(10),
            owner: format!("relay-{}", uuid::Uuid::now_v7()),
            handover: false,
        }
    }
}

impl RelayConfig {
    /// The longest a message can still be delivered again after a consumer first
    /// received it, while this relay's process runs: a lease per attempt, plus the
    /// longest backoff between attempts. An inbox record younger than this must be
    /// kept, or a late duplicate is processed again. (Time a process is down does not
    /// count here: the store never prunes the inbox record of a message whose outbox
    /// row it may still deliver.)
    pub fn redelivery_window(&self) -> Duration {
        let attempts = self.retry.max_attempts.max(1);
        self.lease * (attempts + 1) + self.retry.cap * attempts
    }

    /// Sets [`handover`](Self::handover).
    #[must_use]
    pub fn handover(mut self, on: bool) -> Self {
        self.handover = on;
        self
    }

    /// Sets [`batch_size`](Self::batch_size).
    #[must_use]
    pub fn batch_size(mut self, batch_size: u32) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Sets [`workers`](Self::workers).
    #[must_use]
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// Caps `destination`'s rows in flight at `limit` (see
    /// [`destination_limits`](Self::destination_limits)).
    #[must_use]
    pub fn destination_limit(mut self, destination: impl Into<String>, limit: usize) -> Self {
        self.destination_limits.insert(destination.into(), limit);
        self
    }

    /// Sets [`lease`](Self::lease).
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets [`poll_interval`](Self::poll_interval).
    #[must_use]
    pub fn poll_interval(mut self, poll_interval: Duration) -> Self {
        self.poll_interval = poll_interval;
        self
    }

    /// Sets [`retry`](Self::retry).
    #[must_use]
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets [`breaker_threshold`](Self::breaker_threshold).
    #[must_use]
    pub fn breaker_threshold(mut self, breaker_threshold: u32) -> Self {
        self.breaker_threshold = breaker_threshold;
        self
    }

    /// Sets [`breaker_cooldown`](Self::breaker_cooldown).
    #[must_use]
    pub fn breaker_cooldown(mut self, breaker_cooldown: Duration) -> Self {
        self.breaker_cooldown = breaker_cooldown;
        self
    }

    /// Sets [`shutdown_timeout`](Self::shutdown_timeout).
    #[must_use]
    pub fn shutdown_timeout(mut self, shutdown_timeout: Duration) -> Self {
        self.shutdown_timeout = shutdown_timeout;
        self
    }

    /// Sets [`owner`](Self::owner).
    #[must_use]
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Refuses settings the relay cannot run with.
    pub(crate) fn validate(&self) -> Result<()> {
        let problem = if self.batch_size == 0 {
            "batch_size must be at least 1"
        } else if self.workers == 0 {
            "workers must be at least 1"
        } else if self.destination_limits.values().any(|&n| n == 0) {
            "a destination limit must be at least 1"
        } else if self.lease < Duration::from_millis(3) {
            "lease must be at least 3 ms"
        } else if self.poll_interval.is_zero() {
            "poll_interval must not be zero"
        } else if self.retry.max_attempts == 0 {
            "retry.max_attempts must be at least 1"
        } else if self.owner.trim().is_empty() {
            "owner must not be empty"
        } else {
            return Ok(());
        };
        Err(Error::Config(problem.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = RelayConfig::default();
        assert_eq!(c.batch_size, 100);
        assert_eq!(c.workers, 8);
        assert_eq!(c.lease, Duration::from_secs(30));
        assert_eq!(c.poll_interval, Duration::from_millis(250));
        assert_eq!(c.retry, RetryPolicy::default());
        assert_eq!(c.breaker_threshold, 5);
        assert_eq!(c.breaker_cooldown, Duration::from_secs(5));
        assert_eq!(c.shutdown_timeout, Duration::from_secs(10));
        assert!(c.owner.starts_with("relay-"), "{}", c.owner);
        assert_ne!(c.owner, RelayConfig::default().owner, "owners are unique");
        c.validate().expect("defaults are valid");
    }

    #[test]
    fn nonsense_is_refused() {
        for bad in [
            RelayConfig::default().workers(0),
            RelayConfig::default().batch_size(0),
            RelayConfig::default().destination_limit("d", 0),
            RelayConfig::default().lease(Duration::ZERO),
            RelayConfig::default().poll_interval(Duration::ZERO),
            RelayConfig::default().owner(" "),
            RelayConfig::default().retry(RetryPolicy::new(Duration::ZERO, Duration::ZERO, 0)),
        ] {
            assert!(matches!(bad.validate(), Err(Error::Config(_))), "{bad:?}");
        }
    }
}
