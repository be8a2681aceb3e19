//! Retry policy: exponential backoff with full jitter, a cap, and a budget.

use std::time::Duration;

/// How often and how patiently to try again.
///
/// The delay before retry `n` (1-based) is drawn uniformly from
/// `[0, min(cap, base · 2ⁿ⁻¹)]` ("full jitter"), so that many failing messages do not
/// come back in lockstep. After `max_attempts` attempts the message is given up on
/// (dead-lettered, or the step treated as failed).
///
/// ```
/// use std::time::Duration;
/// use agentsaga_core::RetryPolicy;
///
/// let policy = RetryPolicy::default();
/// assert_eq!(policy.max_attempts, 10);
/// assert!(policy.backoff(3) <= Duration::from_secs(4));
/// assert!(policy.exhausted(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Upper bound of the first delay.
    pub base: Duration,
    /// No delay is longer than this.
    pub cap: Duration,
    /// Attempts in all, the first included.
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    /// 1 s doubling to a 60 s cap, 10 attempts.
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
            max_attempts: 10,
        }
    }
}

impl RetryPolicy {
    /// A policy with the given base, cap and budget.
    pub const fn new(base: Duration, cap: Duration, max_attempts: u32) -> Self {
        Self {
            base,
            cap,
            max_attempts,
        }
    }

    /// The ceiling of the delay after `attempt` failed attempts (1-based), before jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(32);
        let factor = 1u64 << exp;
        let nanos = (self.base.as_nanos()).saturating_mul(u128::from(factor));
        let cap = self.cap.as_nanos();
        Duration::from_nanos(u64::try_from(nanos.min(cap)).unwrap_or(u64::MAX))
    }

    /// A jittered delay after `attempt` failed attempts (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        self.backoff_with(attempt, &mut fastrand::Rng::new())
    }

    /// Like [`backoff`](Self::backoff) with a caller's random source (deterministic tests).
    pub fn backoff_with(&self, attempt: u32, rng: &mut fastrand::Rng) -> Duration {
        let ceiling = self.ceiling(attempt).as_nanos() as u64;
        Duration::from_nanos(rng.u64(0..=ceiling))
    }

    /// True once `attempts` attempts have used up the budget.
    pub fn exhausted(&self, attempts: u32) -> bool {
        attempts >= self.max_attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_then_caps() {
        let p = RetryPolicy::default();
        assert_eq!(p.ceiling(1), Duration::from_secs(1));
        assert_eq!(p.ceiling(2), Duration::from_secs(2));
        assert_eq!(p.ceiling(6), Duration::from_secs(32));
        assert_eq!(p.ceiling(7), Duration::from_secs(60));
        assert_eq!(p.ceiling(1000), Duration::from_secs(60));
    }

    #[test]
    fn jitter_stays_under_the_ceiling_and_varies() {
        let p = RetryPolicy::default();
        let mut rng = fastrand::Rng::with_seed(7);
        let draws: Vec<_> = (0..100).map(|_| p.backoff_with(4, &mut rng)).collect();
        assert!(draws.iter().all(|d| *d <= Duration::from_secs(8)));
        let distinct: std::collections::HashSet<_> = draws.iter().collect();
        assert!(distinct.len() > 50, "full jitter should spread the delays");
    }

    #[test]
    fn budget() {
        let p = RetryPolicy::new(Duration::from_millis(10), Duration::from_secs(1), 3);
        assert!(!p.exhausted(2));
        assert!(p.exhausted(3));
    }
}
