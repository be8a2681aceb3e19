//! The pace's arithmetic, with the clock in the test's hands.

use super::pace::{PROBE_POLL_MS, Pace, Reserved};
use super::*;

fn run(limit: &RateLimit, calls: &[(f64, u64)]) -> Vec<f64> {
    let mut pace = Pace::default();
    calls
        .iter()
        .map(|&(now, tokens)| {
            let (reserved, next) = pace.reserve(limit, tokens, now);
            pace = next;
            match reserved {
                Reserved::At { at, .. } => at,
                Reserved::Later(_) => panic!("no slot at {now}"),
            }
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

/// `n` calls of one destination under `limit`, none with an estimate, all asking
/// for their slot at time 0; each, once it has started, reports `used` tokens. A call
/// told to ask later does so, while those that started report. The times (ms) at
/// which the calls start.
fn unestimated(limit: &RateLimit, n: usize, used: u64) -> Vec<f64> {
    let mut pace = Pace::default();
    let (mut starts, mut now) = (Vec::new(), 0.0);
    while starts.len() < n {
        let mut running = Vec::new();
        let mut again = None;
        for _ in starts.len()..n {
            let (reserved, next) = pace.reserve(limit, 0, now);
            pace = next;
            match reserved {
                Reserved::At { at, tokens, probe } => {
                    starts.push(at);
                    running.push((tokens, probe));
                }
                Reserved::Later(ms) => again = Some(ms),
            }
        }
        for (tokens, probe) in running {
            pace = pace.reconciled(limit, tokens, used, probe);
        }
        now += again.unwrap_or(0.0);
    }
    starts
}

// Ten concurrent calls of 1,000 tokens each, no estimate, under 3,000 tokens a
// minute: at most 3 (+1, one estimate's error) start within the first minute.
#[test]
fn unestimated_concurrent_calls_keep_the_limit() {
    let limit = RateLimit::tokens_per_minute(3_000);
    let at = unestimated(&limit, 10, 1_000);
    let in_the_window = at.iter().filter(|t| **t < 60_000.0).count();
    assert!(in_the_window <= 4, "{in_the_window} started: {at:?}");
}

// A provider's `Retry-After` of a day pauses the destination at most an hour, as
// the HTTP transport caps it.
#[test]
fn a_429_pauses_at_most_an_hour() {
    let limit = RateLimit::requests_per_minute(60);
    let day = Duration::from_secs(86_400);
    let pace = Pace::default().paused(&limit, day, 1_000.0);
    assert_eq!(
        pace.paused_until,
        1_000.0 + MAX_PAUSE.as_secs_f64() * 1000.0
    );
    let (reserved, _) = pace.reserve(&limit, 0, 1_000.0);
    assert_eq!(
        reserved,
        Reserved::At {
            at: 3_601_000.0,
            tokens: 0,
            probe: false
        }
    );
}

/// A pace written at `written` (ms) with every time there, read when the clock says
/// `now`: when the next call may start.
fn next_call_after(limit: &RateLimit, written: f64, now: f64) -> f64 {
    let pace = Pace {
        requests_at: written,
        tokens_at: written,
        paused_until: written,
        written_at: written,
        ..Pace::default()
    };
    match pace.rebased(now).reserve(limit, 0, now).0 {
        Reserved::At { at, .. } => at,
        Reserved::Later(_) => panic!("no slot"),
    }
}

// The clock is stepped back a day after the pace was written: the destination is
// not blocked for that day, only as long as the pace said when it was written.
#[test]
fn a_clock_stepped_back_does_not_block_the_destination() {
    let limit = RateLimit::requests_per_minute(60);
    let day = 86_400_000.0;
    let at = next_call_after(&limit, day + 500.0, 0.0);
    assert_eq!(at, 0.0, "blocked until {at}");
    // A pause stored further ahead than a pause may last is cut to the longest one.
    let pace = Pace {
        paused_until: 3.0 * day,
        ..Pace::default()
    };
    assert_eq!(pace.rebased(0.0).paused_until, 3_600_000.0);
}

// The first call without an estimate goes alone; the others ask again soon, and once
// it has reported they reserve what it used.
#[test]
fn a_first_unestimated_call_goes_alone() {
    let limit = RateLimit::tokens_per_minute(60_000); // one token per ms
    let (first, pace) = Pace::default().reserve(&limit, 0, 0.0);
    assert_eq!(
        first,
        Reserved::At {
            at: 0.0,
            tokens: 0,
            probe: true
        }
    );
    let (second, _) = pace.reserve(&limit, 0, 0.0);
    assert_eq!(second, Reserved::Later(PROBE_POLL_MS));
    let (estimated, _) = pace.reserve(&limit, 10, 0.0);
    assert!(
        matches!(estimated, Reserved::At { probe: false, .. }),
        "{estimated:?}"
    );
    let pace = pace.reconciled(&limit, 0, 400, true);
    let (second, _) = pace.reserve(&limit, 0, 0.0);
    assert_eq!(
        second,
        Reserved::At {
            at: 400.0,
            tokens: 400,
            probe: false
        }
    );
}

// The stored row: a pace written when the clock said a day later than it says now
// (it was stepped back a day since), every time of it a second past then. A call
// reserves its slot at once, not a day later, and the row is rebased on the clock.
async fn a_stored_pace_from_before_a_clock_step_does_not_block(
    backend: agentsaga_core::testing::Backend,
) {
    let url = agentsaga_core::testing::fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    let day = 86_400_000.0;
    let mut tx = store.begin().await.unwrap();
    let (_, now) = read(&mut tx, "llm").await.unwrap();
    let ahead = now + day;
    let stored = Pace {
        requests_at: ahead + 1_000.0,
        tokens_at: ahead + 1_000.0,
        paused_until: ahead + 1_000.0,
        written_at: ahead,
        ..Pace::default()
    };
    write(&mut tx, "llm", stored).await.unwrap();
    tx.commit().await.unwrap();
    let limit = RateLimit::requests_per_minute(60);
    let reserved = reserve(&store, "llm", &limit, 0).await.unwrap();
    let Reservation::Slot { wait, .. } = reserved else {
        panic!("{reserved:?}");
    };
    assert!(wait <= Duration::from_secs(2), "waits {wait:?}");
    let mut tx = store.begin().await.unwrap();
    let (row, now) = read(&mut tx, "llm").await.unwrap();
    assert!(row.written_at <= now, "{row:?} at {now}");
    assert!(row.requests_at < now + 60_000.0, "{row:?} at {now}");
}
agentsaga_core::both_backends!(
    stored_pace_tests,
    a_stored_pace_from_before_a_clock_step_does_not_block
);
