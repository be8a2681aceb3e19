//! A destination's pace, as pure arithmetic on times in milliseconds (the store's
//! transaction around it is in `rate_limit.rs`): reserving a slot, settling what a
//! call used, a 429's pause, and a clock that stepped back since the pace was written.

use std::time::Duration;

use super::limit::{MAX_PAUSE, RateLimit};

/// How long a call that runs without an estimate while nothing is known of the calls
/// of its destination (see [`Pace::reserve`]) keeps others of its kind waiting, at
/// most (ms): it may have crashed.
pub(super) const PROBE_MS: f64 = 60_000.0;

/// How often a call waiting for that first call asks again, at most (ms).
pub(super) const PROBE_POLL_MS: f64 = 1_000.0;

/// A destination's row of `rate_limits`: the theoretical times (ms) at which the next
/// call and the next token are due, until when a provider's 429 paused it, when the
/// row was written (by the clock of the time), the running average of the tokens its
/// calls used (`None`: none reported yet), and until when a call without an estimate
/// is the one finding that out.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Pace {
    pub(super) requests_at: f64,
    pub(super) tokens_at: f64,
    pub(super) paused_until: f64,
    pub(super) written_at: f64,
    pub(super) tokens_avg: Option<f64>,
    pub(super) probe_until: f64,
}

/// What a reservation got.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Reserved {
    /// A slot at `at` (ms) for `tokens` (what settling counts from); `probe`: the call
    /// goes without an estimate to find out what calls use.
    At { at: f64, tokens: u64, probe: bool },
    /// No slot yet: ask again in this many ms (a first call without an estimate is
    /// finding out what calls use).
    Later(f64),
}

impl Pace {
    /// The pace as read at `now`. A clock stepped back since the row was written
    /// (`now` before `written_at`) moves every time back by as much, so that the
    /// destination waits no longer than the pace said when it was written; a pause
    /// is at most [`MAX_PAUSE`] and a probe at most [`PROBE_MS`] from now, whatever
    /// the row says.
    pub(super) fn rebased(self, now: f64) -> Pace {
        let back = (self.written_at - now).max(0.0);
        Pace {
            requests_at: self.requests_at - back,
            tokens_at: self.tokens_at - back,
            paused_until: (self.paused_until - back).min(now + ms(MAX_PAUSE)),
            written_at: self.written_at - back,
            tokens_avg: self.tokens_avg,
            probe_until: (self.probe_until - back).min(now + PROBE_MS),
        }
    }

    /// Reserves a slot at or after `now` for a call that estimates `estimate`
    /// tokens, and the pace after it. A call without an estimate under a tokens limit
    /// reserves the running average of what calls used; with none known yet, the
    /// limit's share of a call (tokens over requests per minute) if requests are
    /// limited too, or else it goes alone to find out (a probe): the others wait for
    /// its report, so that concurrent calls never all start at once.
    pub(super) fn reserve(self, limit: &RateLimit, estimate: u64, now: f64) -> (Reserved, Pace) {
        let mut probe = false;
        let tokens = match (limit.tokens_per_minute, limit.requests_per_minute) {
            (None, _) => estimate,
            _ if estimate > 0 => estimate,
            _ if self.tokens_avg.is_some() => self.tokens_avg.unwrap_or(0.0).ceil() as u64,
            (Some(t), Some(r)) => t.div_ceil(u64::from(r)),
            (Some(_), None) if self.probe_until > now => {
                let again = (self.probe_until - now).min(PROBE_POLL_MS);
                return (Reserved::Later(again), self);
            }
            (Some(_), None) => {
                probe = true;
                0
            }
        };
        let ahead = limit.ahead_ms();
        let tokens = limit.clamp_tokens(tokens);
        let mut at = now.max(self.paused_until);
        if limit.request_interval().is_some() {
            at = at.max(self.requests_at - ahead);
        }
        if limit.token_interval().is_some() {
            at = at.max(self.tokens_at - ahead);
        }
        let next = Pace {
            requests_at: match limit.request_interval() {
                Some(i) => self.requests_at.max(at) + i,
                None => self.requests_at,
            },
            tokens_at: match limit.token_interval() {
                Some(i) => self.tokens_at.max(at) + tokens as f64 * i,
                None => self.tokens_at,
            },
            probe_until: if probe {
                at + PROBE_MS
            } else {
                self.probe_until
            },
            ..self
        };
        (Reserved::At { at, tokens, probe }, next)
    }

    /// A call that reserved `reserved` tokens used `used`: the pace moves by the
    /// difference, the average takes it in, and a probe's wait is over.
    pub(super) fn reconciled(
        self,
        limit: &RateLimit,
        reserved: u64,
        used: u64,
        probe: bool,
    ) -> Pace {
        let mut next = self;
        if probe {
            next.probe_until = 0.0;
        }
        let Some(interval) = limit.token_interval() else {
            return next;
        };
        let (reserved, used) = (limit.clamp_tokens(reserved), limit.clamp_tokens(used));
        next.tokens_at += (used as f64 - reserved as f64) * interval;
        let used = used as f64;
        next.tokens_avg = Some(match self.tokens_avg {
            Some(avg) => avg * 0.75 + used * 0.25,
            None => used,
        });
        next
    }

    /// The pace once a 429 at `now` paused the destination for `retry_after`, at most
    /// [`MAX_PAUSE`].
    pub(super) fn paused(self, limit: &RateLimit, retry_after: Duration, now: f64) -> Pace {
        let until = self.paused_until.max(now + ms(retry_after.min(MAX_PAUSE)));
        // After the pause the pace starts again from its end, with no burst saved up.
        let ahead = limit.ahead_ms();
        Pace {
            paused_until: until,
            requests_at: self.requests_at.max(until + ahead),
            tokens_at: self.tokens_at.max(until + ahead),
            ..self
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
