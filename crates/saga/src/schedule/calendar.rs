//! A schedule's calendar: its cron expression in its time zone, and the times (slots)
//! it names. Cron expressions are parsed by `croner` (5 fields, or 6 with seconds
//! first; OCPS), time zones by `jiff` with the IANA database compiled in.
//!
//! Daylight saving time, as `docs/guarantees.md` states it:
//! - A time the clock skips (02:30 on the night it jumps from 02:00 to 03:00): a
//!   schedule at a fixed time fires once, at the first instant after the gap (03:00);
//!   an interval schedule (`*/15 * * * *`) has no times in the gap.
//! - A time the clock shows twice (01:30 on the night it goes back): every schedule
//!   fires once, at the first of the two instants; the repeated hour's second pass
//!   names no time.

use croner::{Cron, parser::CronParser};
use jiff::{Timestamp, Zoned, tz::TimeZone};

/// How many slots one search may walk over a fold before it gives up (a guard: each
/// search skips at most the repeated times, 7,200 for a schedule every second in the
/// longest fold there is, two hours).
const MAX_REPEATS: usize = 20_000;

/// A cron expression in a time zone.
#[derive(Debug, Clone)]
pub(crate) struct Calendar {
    cron: Cron,
    tz: TimeZone,
}

impl Calendar {
    /// Parses `cron` (5 fields, or 6 with seconds first) and the IANA time zone `tz`.
    pub(crate) fn parse(cron: &str, tz: &str) -> Result<Self, String> {
        let parser = CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build();
        let parsed = parser
            .parse(cron)
            .map_err(|e| format!("`{cron}` is not a cron expression: {e}"))?;
        let tz = TimeZone::get(tz).map_err(|e| format!("`{tz}` is not a time zone: {e}"))?;
        Ok(Self { cron: parsed, tz })
    }

    fn zoned(&self, ms: i64) -> Option<Zoned> {
        Some(
            Timestamp::from_millisecond(ms)
                .ok()?
                .to_zoned(self.tz.clone()),
        )
    }

    /// Is `z` the second instant of a wall clock time the clock shows twice?
    fn repeats(&self, z: &Zoned) -> bool {
        let ambiguous = self.tz.to_ambiguous_zoned(z.datetime());
        ambiguous.is_ambiguous()
            && ambiguous
                .earlier()
                .is_ok_and(|first| first.timestamp() != z.timestamp())
    }

    /// The first slot at or after `ms`.
    pub(crate) fn at_or_after(&self, ms: i64) -> Option<i64> {
        // Slots are whole seconds: from the first whole second at or after `ms`.
        let mut from =
            self.zoned(ms.div_euclid(1000).checked_add(i64::from(ms % 1000 != 0))? * 1000)?;
        let mut inclusive = true;
        for _ in 0..MAX_REPEATS {
            let found = self.cron.find_next_occurrence(&from, inclusive).ok()?;
            if !self.repeats(&found) {
                return Some(found.timestamp().as_millisecond());
            }
            from = found;
            inclusive = false;
        }
        None
    }

    /// The first slot after `ms`.
    pub(crate) fn after(&self, ms: i64) -> Option<i64> {
        self.at_or_after(ms.checked_add(1)?)
    }

    /// The last slot at or before `ms`.
    pub(crate) fn at_or_before(&self, ms: i64) -> Option<i64> {
        let mut from = self.zoned(ms.div_euclid(1000) * 1000)?;
        let mut inclusive = true;
        for _ in 0..MAX_REPEATS {
            let found = self.cron.find_previous_occurrence(&from, inclusive).ok()?;
            if !self.repeats(&found) {
                return Some(found.timestamp().as_millisecond());
            }
            from = found;
            inclusive = false;
        }
        None
    }

    /// The slot after `now` and when it fires: the slot plus a jitter of up to
    /// `jitter_ms`, drawn now.
    pub(crate) fn next_due(&self, jitter_ms: i64, now: i64) -> (Option<i64>, Option<i64>) {
        let slot = self.after(now);
        let due = slot.map(|t| {
            if jitter_ms > 0 {
                t.saturating_add(fastrand::i64(0..=jitter_ms))
            } else {
                t
            }
        });
        (slot, due)
    }

    /// The slots in `[from, to]`, oldest first, at most `max` of them: the latest
    /// `max` when `latest` is set, else the first `max`.
    pub(crate) fn between(&self, from: i64, to: i64, max: usize, latest: bool) -> Vec<i64> {
        let mut out = Vec::new();
        if latest {
            let mut at = to;
            while out.len() < max {
                match self.at_or_before(at) {
                    Some(s) if s >= from => {
                        out.push(s);
                        at = s - 1;
                    }
                    _ => break,
                }
            }
            out.reverse();
        } else {
            let mut at = from;
            while out.len() < max {
                match self.at_or_after(at) {
                    Some(s) if s <= to => {
                        out.push(s);
                        at = s + 1;
                    }
                    _ => break,
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> i64 {
        text.parse::<Timestamp>().unwrap().as_millisecond()
    }

    fn utc(ms: i64) -> String {
        Timestamp::from_millisecond(ms).unwrap().to_string()
    }

    #[test]
    fn five_and_six_fields() {
        let c = Calendar::parse("*/10 * * * * *", "UTC").unwrap();
        assert_eq!(
            utc(c.after(ms("2026-01-01T00:00:00Z")).unwrap()),
            "2026-01-01T00:00:10Z"
        );
        let c = Calendar::parse("0 9 * * MON-FRI", "UTC").unwrap();
        // 2026-01-03 is a Saturday.
        assert_eq!(
            utc(c.after(ms("2026-01-03T10:00:00Z")).unwrap()),
            "2026-01-05T09:00:00Z"
        );
        assert_eq!(
            utc(c.at_or_before(ms("2026-01-05T08:59:59Z")).unwrap()),
            "2026-01-02T09:00:00Z"
        );
    }

    #[test]
    fn bad_expressions_and_zones_are_refused() {
        assert!(
            Calendar::parse("61 * * * *", "UTC")
                .unwrap_err()
                .contains("61")
        );
        assert!(Calendar::parse("* * *", "UTC").is_err());
        let e = Calendar::parse("* * * * *", "Mars/Olympus").unwrap_err();
        assert!(e.contains("Mars/Olympus"), "{e}");
    }

    #[test]
    fn a_slot_exactly_at_from_counts_and_fractions_do_not() {
        let c = Calendar::parse("* * * * * *", "UTC").unwrap();
        let t = ms("2026-01-01T00:00:00Z");
        assert_eq!(c.at_or_after(t), Some(t));
        assert_eq!(c.at_or_after(t + 1), Some(t + 1000));
        assert_eq!(c.at_or_before(t + 999), Some(t));
        assert_eq!(c.after(t), Some(t + 1000));
        assert_eq!(c.between(t, t + 4_500, 10, false).len(), 5);
        assert_eq!(c.between(t, t + 4_500, 2, true), vec![t + 3_000, t + 4_000]);
        assert_eq!(c.between(t, t + 4_500, 2, false), vec![t, t + 1_000]);
    }

    #[test]
    fn a_time_the_clock_skips_fires_once_after_the_gap() {
        // Europe/Paris, 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
        let daily = Calendar::parse("30 2 * * *", "Europe/Paris").unwrap();
        let day_before = ms("2026-03-28T12:00:00Z");
        let first = daily.after(day_before).unwrap();
        assert_eq!(
            utc(first),
            "2026-03-29T01:00:00Z",
            "03:00 CEST, after the gap"
        );
        assert_eq!(utc(daily.after(first).unwrap()), "2026-03-30T00:30:00Z");
        let quarterly = Calendar::parse("*/15 * * * *", "Europe/Paris").unwrap();
        let slots = quarterly.between(
            ms("2026-03-29T00:30:00Z"),
            ms("2026-03-29T01:30:00Z"),
            100,
            false,
        );
        let shown: Vec<String> = slots.into_iter().map(utc).collect();
        // 01:30, 01:45 CET, then 03:00 CEST onwards: no time inside the gap.
        assert_eq!(
            shown,
            [
                "2026-03-29T00:30:00Z",
                "2026-03-29T00:45:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-29T01:15:00Z",
                "2026-03-29T01:30:00Z"
            ]
        );
    }

    #[test]
    fn a_time_the_clock_shows_twice_fires_once() {
        // Europe/Paris, 2026-10-25: 03:00 CEST goes back to 02:00 CET (01:00 UTC), so
        // 02:00-02:59 happens twice: 00:00-00:59 UTC and 01:00-01:59 UTC.
        let daily = Calendar::parse("30 2 * * *", "Europe/Paris").unwrap();
        let first = daily.after(ms("2026-10-24T12:00:00Z")).unwrap();
        assert_eq!(utc(first), "2026-10-25T00:30:00Z", "the first 02:30");
        assert_eq!(utc(daily.after(first).unwrap()), "2026-10-26T01:30:00Z");
        let quarterly = Calendar::parse("*/30 * * * *", "Europe/Paris").unwrap();
        let slots = quarterly.between(
            ms("2026-10-24T23:30:00Z"),
            ms("2026-10-25T02:30:00Z"),
            100,
            false,
        );
        let shown: Vec<String> = slots.into_iter().map(utc).collect();
        assert_eq!(
            shown,
            [
                "2026-10-24T23:30:00Z", // 01:30 CEST
                "2026-10-25T00:00:00Z", // 02:00 CEST
                "2026-10-25T00:30:00Z", // 02:30 CEST; 02:00 and 02:30 CET do not fire
                "2026-10-25T02:00:00Z", // 03:00 CET
                "2026-10-25T02:30:00Z",
            ]
        );
        // Backwards, the same times.
        assert_eq!(
            utc(quarterly.at_or_before(ms("2026-10-25T01:59:00Z")).unwrap()),
            "2026-10-25T00:30:00Z"
        );
    }
}
