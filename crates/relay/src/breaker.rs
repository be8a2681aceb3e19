//! Circuit breakers, one per destination.
//!
//! ```text
//! Closed --threshold consecutive failures--> Open
//! Open   --cooldown elapsed-------------------> HalfOpen (one probe delivery)
//! HalfOpen --probe succeeds-------------------> Closed
//! HalfOpen --probe fails----------------------> Open (for twice the last cooldown)
//! ```
//!
//! An open destination is left out of claims, so its rows stay pending (attempts not
//! spent) and the other destinations keep the workers. Each failed probe doubles the
//! cooldown, up to [`MAX_COOLDOWN`] (or the configured cooldown if longer): a long
//! outage costs one probe a minute, not one a cooldown.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// The longest pause between probes of a destination that stays down (unless the
/// configured cooldown is longer).
pub(crate) const MAX_COOLDOWN: Duration = Duration::from_secs(60);

/// `trips`: how many times in a row the breaker opened without closing (the pause
/// doubles with each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant, trips: u32 },
    HalfOpen { probing: bool, trips: u32 },
}

/// What a recorded outcome did to a breaker, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    Opened,
    Closed,
}

/// Which destinations a claim may ask for.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Claimable {
    /// Breaker closed: claim as many rows as there is room for.
    pub(crate) closed: Vec<String>,
    /// Half-open: claim one row each, the probe.
    pub(crate) probe: Vec<String>,
}

/// The breakers of all destinations of one relay.
#[derive(Debug)]
pub(crate) struct Breakers {
    threshold: u32,
    cooldown: Duration,
    states: HashMap<String, State>,
}

impl Breakers {
    /// `threshold == 0` disables the breakers.
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            threshold,
            cooldown,
            states: HashMap::new(),
        }
    }

    /// Splits `destinations` into those to claim freely and those owed a probe; open
    /// breakers whose cooldown has passed turn half-open here.
    pub(crate) fn claimable(&mut self, destinations: &[String], now: Instant) -> Claimable {
        let mut out = Claimable::default();
        for d in destinations {
            let Some(state) = self.states.get_mut(d) else {
                out.closed.push(d.clone());
                continue;
            };
            match *state {
                State::Closed { .. } => out.closed.push(d.clone()),
                State::Open { until, trips } if now >= until => {
                    *state = State::HalfOpen {
                        probing: false,
                        trips,
                    };
                    out.probe.push(d.clone());
                }
                State::HalfOpen { probing: false, .. } => out.probe.push(d.clone()),
                State::Open { .. } | State::HalfOpen { probing: true, .. } => {}
            }
        }
        out
    }

    /// A probe row was claimed for `destination`: no more until its outcome.
    pub(crate) fn probing(&mut self, destination: &str, probing: bool) {
        if let Some(State::HalfOpen { probing: p, .. }) = self.states.get_mut(destination) {
            *p = probing;
        }
    }

    /// The pause after `trips` openings in a row: the cooldown doubled each time, up to
    /// [`MAX_COOLDOWN`] (or the cooldown itself if longer).
    fn cooldown_after(&self, trips: u32) -> Duration {
        let cap = MAX_COOLDOWN.max(self.cooldown);
        self.cooldown
            .checked_mul(1u32 << trips.min(20))
            .map_or(cap, |d| d.min(cap))
    }

    /// The destinations whose breaker is open, each with when its next probe may go.
    pub(crate) fn pauses(&self) -> Vec<(String, Instant)> {
        self.states
            .iter()
            .filter_map(|(d, s)| match s {
                State::Open { until, .. } => Some((d.clone(), *until)),
                _ => None,
            })
            .collect()
    }

    /// The destinations whose breaker is open or half-open (paused, probed one
    /// delivery at a time).
    pub(crate) fn paused(&self) -> usize {
        self.states
            .values()
            .filter(|s| !matches!(s, State::Closed { .. }))
            .count()
    }

    /// Records a delivery outcome: `ok` for delivered or rejected (the destination
    /// answered), not ok for a retry.
    pub(crate) fn record(&mut self, destination: &str, ok: bool, now: Instant) -> Option<Change> {
        if self.threshold == 0 {
            return None;
        }
        let before = self
            .states
            .get(destination)
            .copied()
            .unwrap_or(State::Closed { failures: 0 });
        let after = match (before, ok) {
            (_, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) if failures + 1 >= self.threshold => State::Open {
                until: now + self.cooldown,
                trips: 1,
            },
            (State::Closed { failures }, false) => State::Closed {
                failures: failures + 1,
            },
            (State::HalfOpen { trips, .. }, false) => State::Open {
                until: now + self.cooldown_after(trips),
                trips: trips.saturating_add(1),
            },
            // A delivery that started before the breaker opened: keep the cooldown.
            (open @ State::Open { .. }, false) => open,
        };
        self.states.insert(destination.to_owned(), after);
        match (before, after) {
            (State::Open { .. }, State::Open { .. }) => None,
            (_, State::Open { .. }) => Some(Change::Opened),
            (State::Open { .. } | State::HalfOpen { .. }, State::Closed { .. }) => {
                Some(Change::Closed)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dests() -> Vec<String> {
        vec!["a".to_owned(), "b".to_owned()]
    }

    #[test]
    fn opens_after_threshold_then_probes_then_closes() {
        let cooldown = Duration::from_secs(5);
        let mut b = Breakers::new(3, cooldown);
        let t0 = Instant::now();
        assert_eq!(b.record("a", false, t0), None);
        assert_eq!(b.record("a", false, t0), None);
        assert_eq!(b.record("a", false, t0), Some(Change::Opened));
        let c = b.claimable(&dests(), t0);
        assert_eq!(c.closed, vec!["b".to_owned()]);
        assert!(c.probe.is_empty());
        // Still cooling down just before the end.
        let c = b.claimable(&dests(), t0 + cooldown - Duration::from_millis(1));
        assert!(c.probe.is_empty());
        // Half-open: one probe.
        let c = b.claimable(&dests(), t0 + cooldown);
        assert_eq!(c.probe, vec!["a".to_owned()]);
        b.probing("a", true);
        let c = b.claimable(&dests(), t0 + cooldown);
        assert!(c.probe.is_empty() && c.closed == vec!["b".to_owned()]);
        assert_eq!(b.record("a", true, t0 + cooldown), Some(Change::Closed));
        assert_eq!(b.claimable(&dests(), t0 + cooldown).closed, dests());
    }

    #[test]
    fn a_failed_probe_reopens_for_twice_the_cooldown() {
        let cooldown = Duration::from_secs(1);
        let mut b = Breakers::new(1, cooldown);
        let t0 = Instant::now();
        assert_eq!(b.record("a", false, t0), Some(Change::Opened));
        let t1 = t0 + cooldown;
        assert_eq!(b.claimable(&dests(), t1).probe, vec!["a".to_owned()]);
        b.probing("a", true);
        assert_eq!(b.record("a", false, t1), Some(Change::Opened));
        assert!(b.claimable(&dests(), t1 + cooldown).probe.is_empty());
        assert_eq!(
            b.claimable(&dests(), t1 + 2 * cooldown).probe,
            vec!["a".to_owned()]
        );
    }

    #[test]
    fn successes_reset_the_count_and_zero_disables() {
        let mut b = Breakers::new(2, Duration::from_secs(1));
        let t = Instant::now();
        b.record("a", false, t);
        b.record("a", true, t);
        assert_eq!(b.record("a", false, t), None, "the count restarted");
        let mut off = Breakers::new(0, Duration::from_secs(1));
        for _ in 0..100 {
            assert_eq!(off.record("a", false, t), None);
        }
        assert_eq!(off.claimable(&dests(), t).closed, dests());
    }

    #[test]
    fn the_pause_doubles_while_probes_fail_up_to_a_minute() {
        let cooldown = Duration::from_secs(5);
        let mut b = Breakers::new(1, cooldown);
        let mut t = Instant::now();
        assert_eq!(b.record("a", false, t), Some(Change::Opened));
        assert_eq!(b.paused(), 1);
        // The first pause is the cooldown, each failed probe doubles it, up to a minute.
        for secs in [5, 10, 20, 40, 60, 60, 60] {
            let pause = Duration::from_secs(secs);
            assert!(
                b.claimable(&dests(), t + pause - Duration::from_millis(1))
                    .probe
                    .is_empty(),
                "probed before {secs} s"
            );
            t += pause;
            assert_eq!(b.claimable(&dests(), t).probe, vec!["a".to_owned()]);
            b.probing("a", true);
            assert_eq!(b.record("a", false, t), Some(Change::Opened));
        }
        let t = t + Duration::from_secs(60);
        assert_eq!(b.claimable(&dests(), t).probe, vec!["a".to_owned()]);
        assert_eq!(b.record("a", true, t), Some(Change::Closed));
        assert_eq!(b.paused(), 0);
    }

    #[test]
    fn late_failures_do_not_extend_an_open_breaker() {
        let cooldown = Duration::from_secs(1);
        let mut b = Breakers::new(1, cooldown);
        let t0 = Instant::now();
        b.record("a", false, t0);
        assert_eq!(b.record("a", false, t0 + cooldown / 2), None);
        assert_eq!(
            b.claimable(&dests(), t0 + cooldown).probe,
            vec!["a".to_owned()]
        );
    }
}
