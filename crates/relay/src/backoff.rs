//! Backoff after database errors: the relay never gives up on its database, it waits
//! longer and longer (up to a cap) between attempts and logs each failure.

use std::time::Duration;

use tokio::time::Instant;

const FIRST: Duration = Duration::from_millis(50);
const CAP: Duration = Duration::from_secs(5);

/// Exponential backoff for one kind of database call (claims, acknowledgements).
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    /// The last delay, zero when healthy.
    delay: Duration,
    /// No attempt before this.
    until: Option<Instant>,
}

impl Backoff {
    /// A failure: returns how long to wait before the next attempt.
    pub(crate) fn fail(&mut self, now: Instant) -> Duration {
        self.delay = if self.delay.is_zero() {
            FIRST
        } else {
            (self.delay * 2).min(CAP)
        };
        self.until = Some(now + self.delay);
        self.delay
    }

    /// A success: back to full speed.
    pub(crate) fn reset(&mut self) {
        self.delay = Duration::ZERO;
        self.until = None;
    }

    /// How long until an attempt is allowed; zero if allowed now.
    pub(crate) fn remaining(&self, now: Instant) -> Duration {
        self.until
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn doubles_to_the_cap_and_resets() {
        let mut b = Backoff::default();
        assert_eq!(b.remaining(Instant::now()), Duration::ZERO);
        let delays: Vec<_> = (0..10).map(|_| b.fail(Instant::now())).collect();
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        assert_eq!(b.remaining(Instant::now()), CAP);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(b.remaining(Instant::now()), Duration::from_secs(3));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(b.remaining(Instant::now()), Duration::ZERO);
        b.reset();
        assert_eq!(b.fail(Instant::now()), FIRST);
    }
}
