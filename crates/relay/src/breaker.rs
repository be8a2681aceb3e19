//! Circuit breakers, one per destination.
//!
//! ```text
//! Closed --threshold consecutive failures--> Open
//! Open   --cooldown elapsed-------------------> HalfOpen (one probe delivery)
//! HalfOpen --probe succeeds-------------------> Closed
//! HalfOpen --probe fails----------------------> Open
//! ```
//!
//! An open destination is left out of claims, so its rows stay pending (attempts not
//! spent) and the other destinations keep the workers.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probing: bool },
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
                State::Open { until } if now >= until => {
                    *state = State::HalfOpen { probing: false };
                    out.probe.push(d.clone());
                }
                State::HalfOpen { probing: false } => out.probe.push(d.clone()),
                State::Open { .. } | State::HalfOpen { probing: true } => {}
            }
        }
        out
    }

    /// A probe row was claimed for `destination`: no more until its outcome.
    pub(crate) fn probing(&mut self, destination: &str, probing: bool) {
        if let Some(State::HalfOpen { probing: p }) = self.states.get_mut(destination) {
            *p = probing;
        }
    }

    /// Records a delivery outcome: `ok` for delivered or rejected (the destination
    /// answered), not ok for a retry.
    pub(crate) fn record(&mut self, destination: &str, ok: bool, now: Instant) -> Option<Change> {
        if self.threshold == 0 {
            return None;
        }
        let state = self
            .states
            .entry(destination.to_owned())
            .or_insert(State::Closed { failures: 0 });
        let before = *state;
        *state = match (before, ok) {
            (_, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) if failures + 1 >= self.threshold => State::Open {
                until: now + self.cooldown,
            },
            (State::Closed { failures }, false) => State::Closed {
                failures: failures + 1,
            },
            (State::HalfOpen { .. }, false) => State::Open {
                until: now + self.cooldown,
            },
            // A delivery that started before the breaker opened: keep the cooldown.
            (open @ State::Open { .. }, false) => open,
        };
        match (before, *state) {
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
    fn a_failed_probe_reopens_for_a_full_cooldown() {
        let cooldown = Duration::from_secs(1);
        let mut b = Breakers::new(1, cooldown);
        let t0 = Instant::now();
        assert_eq!(b.record("a", false, t0), Some(Change::Opened));
        let t1 = t0 + cooldown;
        assert_eq!(b.claimable(&dests(), t1).probe, vec!["a".to_owned()]);
        b.probing("a", true);
        assert_eq!(b.record("a", false, t1), Some(Change::Opened));
        assert!(b.claimable(&dests(), t1 + cooldown / 2).probe.is_empty());
        assert_eq!(
            b.claimable(&dests(), t1 + cooldown).probe,
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
