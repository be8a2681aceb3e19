//! Provider rate limits, shared by every process of a database: requests and tokens
//! per minute for a destination ([`RuntimeBuilder::rate_limit`](crate::RuntimeBuilder::rate_limit)).
//!
//! The state is in the database (`rate_limits`, one row per destination), not in
//! memory: N processes calling one provider account share one pace. It is a generic
//! cell rate algorithm (GCRA) that schedules rather than refuses: each call reserves
//! the next slot in one short transaction (the row locked), then waits for it with
//! nothing held — no transaction, no connection, no retry spent — and calls. Slots are
//! spaced by the limit (`60 s / requests_per_minute`, and a call's tokens at
//! `60 s / tokens_per_minute` each); [`RateLimit::burst`] lets calls run that far
//! ahead of the pace after a quiet spell. A call declares its tokens beforehand
//! ([`CallingAgent::estimate_tokens`](crate::CallingAgent::estimate_tokens)); what it
//! reports it used ([`CallContext::report_usage`](crate::CallContext::report_usage))
//! settles the difference. A provider's `429` ([`StepError::RateLimited`](crate::StepError::RateLimited))
//! pauses the whole destination until its `Retry-After`.
//!
//! Times are milliseconds: the database's clock on PostgreSQL (processes on several
//! machines agree on it), the process's on SQLite (one machine).

use std::time::Duration;

use agentsaga_core::sqlx::{self, Row as _};
use agentsaga_core::{Store, Tx};

/// How long a 429 without a `Retry-After` waits.
pub(crate) const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Rate-limited calls in a row one delivery makes before it gives its message back to
/// the relay (one relay attempt, not a step retry).
pub(crate) const MAX_RATE_LIMITED: u32 = 8;

/// A destination's limits. At least one of requests or tokens per minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    requests_per_minute: Option<u32>,
    tokens_per_minute: Option<u64>,
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
    fn request_interval(&self) -> Option<f64> {
        self.requests_per_minute.map(|n| 60_000.0 / f64::from(n))
    }

    /// Milliseconds a token takes, if tokens are limited.
    fn token_interval(&self) -> Option<f64> {
        self.tokens_per_minute.map(|n| 60_000.0 / n as f64)
    }

    /// `tokens` as one call may count them: at most ten minutes' worth, so that no
    /// estimate or report (a typo, an overflow) stalls the destination for longer.
    fn clamp_tokens(&self, tokens: u64) -> u64 {
        self.tokens_per_minute
            .map_or(tokens, |n| tokens.min(n.saturating_mul(10)))
    }

    /// How far ahead of the pace calls may run, ms.
    fn ahead_ms(&self) -> f64 {
        self.burst.as_secs_f64() * 1000.0
    }
}

/// Every rate-limited destination is one that a calling agent of this runtime
/// consumes (`calling`: their destinations; a limit elsewhere would limit nothing).
pub(crate) fn check<'a>(
    limits: &std::collections::HashMap<String, RateLimit>,
    calling: impl Iterator<Item = &'a str> + Clone,
) -> crate::Result<()> {
    for destination in limits.keys() {
        if !calling.clone().any(|d| d == destination) {
            return Err(crate::Error::Config(format!(
                "rate limit for `{destination}`, which no calling agent of this runtime \
                 consumes: declare it where the agent runs"
            )));
        }
    }
    Ok(())
}

/// A destination's row of `rate_limits`: the theoretical times (ms) at which the next
/// call and the next token are due, and until when a provider's 429 paused it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Pace {
    requests_at: f64,
    tokens_at: f64,
    paused_until: f64,
}

impl Pace {
    /// Reserves a slot for a call of `tokens` at or after `now`: the slot's time, and
    /// the pace after it.
    fn reserve(self, limit: &RateLimit, tokens: u64, now: f64) -> (f64, Pace) {
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
            paused_until: self.paused_until,
        };
        (at, next)
    }
}

/// Reserves the next slot of `destination` for a call of `tokens` (estimated), in one
/// transaction: how long to wait for it.
///
/// # Errors
/// Store errors.
pub(crate) async fn reserve(
    store: &Store,
    destination: &str,
    limit: &RateLimit,
    tokens: u64,
) -> agentsaga_core::Result<Duration> {
    change(store, destination, |pace, now| {
        let (at, next) = pace.reserve(limit, tokens, now);
        (
            next,
            Duration::from_secs_f64(((at - now) / 1000.0).max(0.0)),
        )
    })
    .await
}

/// A call reserved `estimated` tokens and used `used`: the pace moves by the difference.
///
/// # Errors
/// Store errors.
pub(crate) async fn settle(
    store: &Store,
    destination: &str,
    limit: &RateLimit,
    estimated: u64,
    used: u64,
) -> agentsaga_core::Result<()> {
    let (estimated, used) = (limit.clamp_tokens(estimated), limit.clamp_tokens(used));
    let Some(interval) = limit.token_interval().filter(|_| estimated != used) else {
        return Ok(());
    };
    let shift = (used as f64 - estimated as f64) * interval;
    change(store, destination, |pace, _| {
        let next = Pace {
            tokens_at: pace.tokens_at + shift,
            ..pace
        };
        (next, ())
    })
    .await
}

/// The provider answered 429: no call of `destination` starts before `retry_after`
/// from now, in any process.
///
/// # Errors
/// Store errors.
pub(crate) async fn pause(
    store: &Store,
    destination: &str,
    limit: &RateLimit,
    retry_after: Duration,
) -> agentsaga_core::Result<()> {
    let ms = retry_after.as_secs_f64() * 1000.0;
    // After the pause the pace starts again from its end, with no burst saved up.
    let ahead = limit.ahead_ms();
    change(store, destination, |pace, now| {
        let until = pace.paused_until.max(now + ms);
        let next = Pace {
            paused_until: until,
            requests_at: pace.requests_at.max(until + ahead),
            tokens_at: pace.tokens_at.max(until + ahead),
        };
        (next, ())
    })
    .await
}

/// Reads `destination`'s pace (locked) and the clock, writes what `f` makes of them,
/// commits: one transaction.
async fn change<T>(
    store: &Store,
    destination: &str,
    f: impl FnOnce(Pace, f64) -> (Pace, T),
) -> agentsaga_core::Result<T> {
    let mut tx = store.begin().await?;
    let (pace, now) = read(&mut tx, destination).await?;
    let (next, out) = f(pace, now);
    if next != pace {
        write(&mut tx, destination, next).await?;
    }
    tx.commit().await?;
    Ok(out)
}

async fn read(tx: &mut Tx, destination: &str) -> agentsaga_core::Result<(Pace, f64)> {
    let row = agentsaga_core::match_conn!(tx.conn(), sqlite(c) => {
        sqlx::query(
            "INSERT INTO rate_limits (destination) VALUES (?1) ON CONFLICT DO NOTHING",
        )
        .bind(destination)
        .execute(&mut *c)
        .await?;
        let r = sqlx::query(
            "SELECT requests_at, tokens_at, paused_until FROM rate_limits WHERE destination = ?1",
        )
        .bind(destination)
        .fetch_one(&mut *c)
        .await?;
        let now = agentsaga_core::clock::now_ms() as f64;
        (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, now)
    }, postgres(c) => {
        sqlx::query("INSERT INTO rate_limits (destination) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(destination)
            .execute(&mut *c)
            .await?;
        let r = sqlx::query(
            "SELECT requests_at, tokens_at, paused_until,
                extract(epoch FROM clock_timestamp())::float8 * 1000 AS now
             FROM rate_limits WHERE destination = $1 FOR UPDATE",
        )
        .bind(destination)
        .fetch_one(&mut *c)
        .await?;
        (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)
    });
    let (requests_at, tokens_at, paused_until, now) = row;
    Ok((
        Pace {
            requests_at,
            tokens_at,
            paused_until,
        },
        now,
    ))
}

async fn write(tx: &mut Tx, destination: &str, pace: Pace) -> agentsaga_core::Result<()> {
    agentsaga_core::with_conn!(tx.conn(), c => {
        sqlx::query(
            "UPDATE rate_limits SET requests_at = $2, tokens_at = $3, paused_until = $4
             WHERE destination = $1",
        )
        .bind(destination)
        .bind(pace.requests_at)
        .bind(pace.tokens_at)
        .bind(pace.paused_until)
        .execute(&mut *c)
        .await?;
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(limit: &RateLimit, calls: &[(f64, u64)]) -> Vec<f64> {
        let mut pace = Pace::default();
        calls
            .iter()
            .map(|&(now, tokens)| {
                let (at, next) = pace.reserve(limit, tokens, now);
                pace = next;
                at
            })
            .collect()
    }

    #[test]
    fn calls_are_spaced_by_the_limit() {
        let limit = RateLimit::requests_per_minute(600); // one per 100 ms
        let at = run(&limit, &[(1000.0, 0); 4]);
        assert_eq!(at, [1000.0, 1100.0, 1200.0, 1300.0]);
        // After a quiet spell, the pace starts again from now (no credit without burst).
        let at = run(&limit, &[(1000.0, 0), (5000.0, 0), (5000.0, 0)]);
        assert_eq!(at, [1000.0, 5000.0, 5100.0]);
    }

    #[test]
    fn a_burst_runs_ahead_then_keeps_the_pace() {
        let limit = RateLimit::requests_per_minute(600).burst(Duration::from_millis(200));
        let at = run(&limit, &[(1000.0, 0); 5]);
        assert_eq!(at, [1000.0, 1000.0, 1000.0, 1100.0, 1200.0]);
    }

    #[test]
    fn no_call_counts_more_than_ten_minutes_of_tokens() {
        let limit = RateLimit::tokens_per_minute(60_000); // one token per ms
        let at = run(&limit, &[(0.0, u64::MAX), (0.0, 0)]);
        assert_eq!(at, [0.0, 600_000.0]);
    }

    #[test]
    fn tokens_pace_by_what_calls_take() {
        let limit = RateLimit::tokens_per_minute(60_000); // one token per ms
        let at = run(&limit, &[(0.0, 500), (0.0, 100), (0.0, 0)]);
        assert_eq!(at, [0.0, 500.0, 600.0]);
        let both = RateLimit::requests_per_minute(6_000).and_tokens_per_minute(60_000);
        let at = run(&both, &[(0.0, 0), (0.0, 0), (0.0, 50)]);
        assert_eq!(at, [0.0, 10.0, 20.0]);
    }
}
