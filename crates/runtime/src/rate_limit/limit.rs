//! A destination's limits (requests and tokens per minute, a burst), and the longest a
//! provider's 429 pauses it.

use std::time::Duration;

/// The longest a 429 pauses a destination, whatever its `Retry-After` says (as the
/// HTTP transport caps it).
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(3600);

/// A destination's limits. At least one of requests or tokens per minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub(super) requests_per_minute: Option<u32>,
    pub(super) tokens_per_minute: Option<u64>,
    burst: Duration,
}

impl RateLimit {
    /// At most `n` calls a minute (at least 1).
    pub fn requests_per_minute(n: u32) -> Self {
        Self {
            requests_per_minute: Some(n.max(1)),
            tokens_per_minute: None,
            burst: Duration::ZERO,
        }
    }

    /// At most `n` tokens a minute (at least 1), as calls estimate and report them.
    pub fn tokens_per_minute(n: u64) -> Self {
        Self {
            requests_per_minute: None,
            tokens_per_minute: Some(n.max(1)),
            burst: Duration::ZERO,
        }
    }

    /// Also at most `n` tokens a minute.
    #[must_use]
    pub fn and_tokens_per_minute(mut self, n: u64) -> Self {
        self.tokens_per_minute = Some(n.max(1));
        self
    }

    /// Also at most `n` calls a minute.
    #[must_use]
    pub fn and_requests_per_minute(mut self, n: u32) -> Self {
        self.requests_per_minute = Some(n.max(1));
        self
    }

    /// How far calls may run ahead of the pace after a quiet spell (default none:
    /// evenly spaced). `requests_per_minute(600).burst(1 s)` lets 11 calls go at once,
    /// then one every 100 ms.
    #[must_use]
    pub fn burst(mut self, ahead: Duration) -> Self {
        self.burst = ahead;
        self
    }

    /// Milliseconds between two calls, if requests are limited.
    pub(super) fn request_interval(&self) -> Option<f64> {
        self.requests_per_minute.map(|n| 60_000.0 / f64::from(n))
    }

    /// Milliseconds a token takes, if tokens are limited.
    pub(super) fn token_interval(&self) -> Option<f64> {
        self.tokens_per_minute.map(|n| 60_000.0 / n as f64)
    }

    /// `tokens` as one call may count them: at most ten minutes' worth, so that no
    /// estimate or report (a typo, an overflow) stalls the destination for longer.
    pub(super) fn clamp_tokens(&self, tokens: u64) -> u64 {
        self.tokens_per_minute
            .map_or(tokens, |n| tokens.min(n.saturating_mul(10)))
    }

    /// How far ahead of the pace calls may run, ms.
    pub(super) fn ahead_ms(&self) -> f64 {
        self.burst.as_secs_f64() * 1000.0
    }
}
