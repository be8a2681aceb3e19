//! Counters a running relay keeps, read through [`Relay::stats`](crate::Relay::stats).

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a relay's counters since it started.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RelayStats {
    /// Rows marked delivered.
    pub delivered: u64,
    /// Rows sent back for a later attempt.
    pub retried: u64,
    /// Rows dead-lettered.
    pub dead: u64,
    /// Rows released unfinished (shutdown).
    pub released: u64,
    /// Deliveries in progress right now.
    pub in_flight: u64,
    /// Rows taken by direct handover (no claim), of all delivered, retried, dead or
    /// released ones.
    pub handed_over: u64,
    /// Database calls that failed (each one logged and retried).
    pub db_errors: u64,
    /// Times a destination's circuit breaker opened.
    pub breaker_trips: u64,
    /// Destinations paused right now by their circuit breaker (unreachable or
    /// failing: probed one delivery at a time).
    pub paused: u64,
    /// Deliveries cancelled because the relay lost their row's lease (it expired and
    /// another delivery took the row, or renewing failed until it ran out).
    pub leases_lost: u64,
    /// Deliveries with a measured latency (enqueue to delivered).
    pub latency_count: u64,
    /// Sum of those latencies, in milliseconds.
    pub latency_sum_ms: u64,
    /// Median latency, in milliseconds (upper bound of its histogram bucket, ≤ 25 % over).
    pub latency_p50_ms: Option<u64>,
    /// 99th percentile latency, in milliseconds (same precision).
    pub latency_p99_ms: Option<u64>,
}

impl RelayStats {
    /// Mean enqueue-to-delivered latency in milliseconds, if anything was delivered.
    pub fn latency_mean_ms(&self) -> Option<f64> {
        (self.latency_count > 0).then(|| self.latency_sum_ms as f64 / self.latency_count as f64)
    }
}

/// Four buckets per power of two: values are known to within 25 %.
const BUCKETS: usize = 4 + 4 * 62;

/// The live counters, shared by the claimer (writer) and the handle (reader).
#[derive(Debug)]
pub(crate) struct StatsCell {
    delivered: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    released: AtomicU64,
    in_flight: AtomicU64,
    handed_over: AtomicU64,
    db_errors: AtomicU64,
    breaker_trips: AtomicU64,
    paused: AtomicU64,
    /// The destinations paused by their breaker, and until when (`Relay::pauses`).
    pauses: std::sync::Mutex<Vec<(String, tokio::time::Instant)>>,
    leases_lost: AtomicU64,
    latency_sum_ms: AtomicU64,
    histogram: Box<[AtomicU64]>,
}

impl Default for StatsCell {
    fn default() -> Self {
        Self {
            delivered: AtomicU64::new(0),
            retried: AtomicU64::new(0),
            dead: AtomicU64::new(0),
            released: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            handed_over: AtomicU64::new(0),
            db_errors: AtomicU64::new(0),
            breaker_trips: AtomicU64::new(0),
            paused: AtomicU64::new(0),
            pauses: std::sync::Mutex::default(),
            leases_lost: AtomicU64::new(0),
            latency_sum_ms: AtomicU64::new(0),
            histogram: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl StatsCell {
    pub(crate) fn delivered(&self, n: u64) {
        self.delivered.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn retried(&self, n: u64) {
        self.retried.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn dead(&self, n: u64) {
        self.dead.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn released(&self, n: u64) {
        self.released.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn set_in_flight(&self, n: usize) {
        self.in_flight.store(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn handed_over(&self, n: u64) {
        self.handed_over.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn db_error(&self) {
        self.db_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn leases_lost(&self, n: usize) {
        self.leases_lost.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn breaker_tripped(&self) {
        self.breaker_trips.fetch_add(1, Ordering::Relaxed);
    }

    /// How many destinations their breaker pauses (`n`), and which until when: the
    /// list is only built (`pauses`) while some are, or were until now, so that a
    /// relay whose breakers are all closed pays one atomic store per outcome.
    pub(crate) fn set_paused(
        &self,
        n: usize,
        pauses: impl FnOnce() -> Vec<(String, tokio::time::Instant)>,
    ) {
        let before = self.paused.swap(n as u64, Ordering::Relaxed);
        if n > 0 || before > 0 {
            *self
                .pauses
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = pauses();
        }
    }

    /// The destinations paused by their breaker, and until when.
    pub(crate) fn pauses(&self) -> Vec<(String, tokio::time::Instant)> {
        self.pauses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn latency(&self, ms: u64) {
        self.latency_sum_ms.fetch_add(ms, Ordering::Relaxed);
        self.histogram[bucket(ms)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> RelayStats {
        let counts: Vec<u64> = self
            .histogram
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        RelayStats {
            delivered: self.delivered.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead: self.dead.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            handed_over: self.handed_over.load(Ordering::Relaxed),
            db_errors: self.db_errors.load(Ordering::Relaxed),
            breaker_trips: self.breaker_trips.load(Ordering::Relaxed),
            paused: self.paused.load(Ordering::Relaxed),
            leases_lost: self.leases_lost.load(Ordering::Relaxed),
            latency_count: total,
            latency_sum_ms: self.latency_sum_ms.load(Ordering::Relaxed),
            latency_p50_ms: quantile(&counts, total, 50),
            latency_p99_ms: quantile(&counts, total, 99),
        }
    }
}

/// The bucket of `v`: exact below 4, then 4 buckets per power of two.
fn bucket(v: u64) -> usize {
    if v < 4 {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros() as usize; // ≥ 2
    let mantissa = ((v >> (exp - 2)) & 3) as usize;
    (4 + (exp - 2) * 4 + mantissa).min(BUCKETS - 1)
}

/// The largest value that falls in bucket `i`.
fn upper_bound(i: usize) -> u64 {
    if i < 4 {
        return i as u64;
    }
    let exp = (i - 4) / 4 + 2;
    let mantissa = ((i - 4) % 4) as u64;
    ((4 + mantissa + 1) << (exp - 2)).saturating_sub(1)
}

fn quantile(counts: &[u64], total: u64, percent: u64) -> Option<u64> {
    if total == 0 {
        return None;
    }
    // The rank of the percentile, 1-based, rounded up.
    let rank = (total * percent).div_ceil(100).max(1);
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(upper_bound(i));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_bound_their_values_within_a_quarter() {
        for v in (0..5000).chain([u64::MAX / 2, 1 << 40, 123_456_789]) {
            let b = bucket(v);
            let hi = upper_bound(b);
            assert!(hi >= v, "{v} in bucket {b} with bound {hi}");
            assert!(hi as f64 <= (v as f64) * 1.25 + 1.0, "{v} -> {hi}");
            if b > 0 {
                assert!(upper_bound(b - 1) < v, "{v} belongs to a lower bucket");
            }
        }
    }

    #[test]
    fn percentiles_and_mean() {
        let s = StatsCell::default();
        assert_eq!(s.snapshot().latency_p50_ms, None);
        for ms in 1..=100 {
            s.latency(ms);
        }
        let snap = s.snapshot();
        assert_eq!(snap.latency_count, 100);
        assert_eq!(snap.latency_sum_ms, 5050);
        assert_eq!(snap.latency_mean_ms(), Some(50.5));
        let p50 = snap.latency_p50_ms.unwrap();
        assert!((50..=63).contains(&p50), "{p50}");
        let p99 = snap.latency_p99_ms.unwrap();
        assert!((99..=127).contains(&p99), "{p99}");
    }
}
