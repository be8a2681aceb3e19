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
//! reconciles the difference; a call without an estimate reserves the running average of
//! what calls reported, and while none has, it goes alone (see `Pace::reserve`), so
//! that a limit holds for concurrent calls within one estimate's error. A provider's
//! `429` ([`StepError::RateLimited`](crate::StepError::RateLimited)) pauses the whole
//! destination until its `Retry-After`, at most [`MAX_PAUSE`].
//!
//! Times are milliseconds: the database's clock on PostgreSQL (processes on several
//! machines agree on it), the process's on SQLite (one machine). A clock stepped back
//! since the row was written moves the pace back by as much (`Pace::rebased`).

use std::time::Duration;

use agentsaga_core::{Sql, Store, Tx};

mod limit;
mod pace;

pub(crate) use limit::MAX_PAUSE;
pub use limit::RateLimit;

use pace::{Pace, Reserved};

/// How long a 429 without a `Retry-After` waits.
pub(crate) const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Rate-limited calls in a row one delivery makes before it gives its message back to
/// the relay (one relay attempt, not a step retry).
pub(crate) const MAX_RATE_LIMITED: u32 = 8;

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

/// A call's reservation: how long to wait for its slot, and what settling its tokens
/// counts from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Reservation {
    /// Start after `wait`.
    Slot {
        /// How long to wait for the slot.
        wait: Duration,
        /// The tokens reserved (what [`reconcile`] counts the call's report from).
        tokens: u64,
        /// The call goes without an estimate to find out what calls use.
        probe: bool,
    },
    /// No slot yet: ask again after this long.
    Later(Duration),
}

fn duration_ms(ms: f64) -> Duration {
    Duration::from_secs_f64((ms / 1000.0).max(0.0))
}

/// Reserves the next slot of `destination` for a call that estimates `estimate`
/// tokens (0: none given), in one transaction (see [`Pace::reserve`]).
///
/// # Errors
/// Store errors.
pub(crate) async fn reserve(
    store: &Store,
    destination: &str,
    limit: &RateLimit,
    estimate: u64,
) -> agentsaga_core::Result<Reservation> {
    change(store, destination, |pace, now| {
        let (reserved, next) = pace.reserve(limit, estimate, now);
        let out = match reserved {
            Reserved::At { at, tokens, probe } => Reservation::Slot {
                wait: duration_ms(at - now),
                tokens,
                probe,
            },
            Reserved::Later(ms) => Reservation::Later(duration_ms(ms)),
        };
        (next, out)
    })
    .await
}

/// A call whose reservation was `reservation` used `used` tokens: the pace moves by
/// the difference, and the destination's average takes it in.
///
/// # Errors
/// Store errors.
pub(crate) async fn reconcile(
    store: &Store,
    destination: &str,
    limit: &RateLimit,
    reservation: Reservation,
    used: u64,
) -> agentsaga_core::Result<()> {
    let Reservation::Slot { tokens, probe, .. } = reservation else {
        return Ok(());
    };
    if limit.tokens_per_minute.is_none() && !probe {
        return Ok(());
    }
    change(store, destination, |pace, _| {
        (pace.reconciled(limit, tokens, used, probe), ())
    })
    .await
}

/// The provider answered 429: no call of `destination` starts before `retry_after`
/// (at most [`MAX_PAUSE`]) from now, in any process.
///
/// # Errors
/// Store errors.
pub(crate) async fn pause(
    store: &Store,
    destination: &str,
    limit: &RateLimit,
    retry_after: Duration,
) -> agentsaga_core::Result<()> {
    change(store, destination, |pace, now| {
        (pace.paused(limit, retry_after, now), ())
    })
    .await
}

/// Reads `destination`'s pace (locked) and the clock, writes what `f` makes of them
/// (rebased on the clock, see [`Pace::rebased`]), commits: one transaction.
async fn change<T>(
    store: &Store,
    destination: &str,
    f: impl FnOnce(Pace, f64) -> (Pace, T),
) -> agentsaga_core::Result<T> {
    let mut tx = store.begin().await?;
    let (stored, now) = read(&mut tx, destination).await?;
    let pace = stored.rebased(now);
    let (mut next, out) = f(pace, now);
    if next != stored {
        next.written_at = now;
        write(&mut tx, destination, next).await?;
    }
    tx.commit().await?;
    Ok(out)
}

/// The columns of a pace, in [`Pace`]'s order.
const COLUMNS: &str = "requests_at, tokens_at, paused_until, written_at, tokens_avg, probe_until";

/// A [`Pace`] from a row that selected [`COLUMNS`].
fn pace_of(r: &agentsaga_core::Row) -> agentsaga_core::Result<Pace> {
    Ok(Pace {
        requests_at: r.real("requests_at")?,
        tokens_at: r.real("tokens_at")?,
        paused_until: r.real("paused_until")?,
        written_at: r.real("written_at")?,
        tokens_avg: r.opt_real("tokens_avg")?,
        probe_until: r.real("probe_until")?,
    })
}

/// The destination's pace, its row locked until the transaction ends (where the
/// database locks rows; SQLite's single writer serialises writers already), and now by
/// the database's clock (this process's on SQLite).
async fn read(tx: &mut Tx, destination: &str) -> agentsaga_core::Result<(Pace, f64)> {
    Sql::new("INSERT INTO rate_limits (destination) VALUES (?) ON CONFLICT DO NOTHING")
        .bind(destination)
        .execute(tx.conn())
        .await?;
    let r = Sql::new(format!(
        "SELECT {COLUMNS}, {{clock_ms}} AS now FROM rate_limits WHERE destination = ?"
    ))
    .bind(destination)
    .for_update()
    .fetch_one(tx.conn())
    .await?;
    Ok((pace_of(&r)?, r.real("now")?))
}

async fn write(tx: &mut Tx, destination: &str, pace: Pace) -> agentsaga_core::Result<()> {
    Sql::new(
        "UPDATE rate_limits SET requests_at = ?, tokens_at = ?, paused_until = ?,
            written_at = ?, tokens_avg = ?, probe_until = ?
         WHERE destination = ?",
    )
    .bind(pace.requests_at)
    .bind(pace.tokens_at)
    .bind(pace.paused_until)
    .bind(pace.written_at)
    .bind(pace.tokens_avg)
    .bind(pace.probe_until)
    .bind(destination)
    .execute(tx.conn())
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests;
