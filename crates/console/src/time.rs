//! Timestamps and durations as operators write and read them.

use std::time::Duration;

/// Unix milliseconds as an RFC 3339 UTC timestamp with milliseconds,
/// e.g. `2024-05-01T12:34:56.789Z`.
pub fn rfc3339(unix_ms: i64) -> String {
    let secs = unix_ms.div_euclid(1000);
    let ms = unix_ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32; // [1, 31]
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32; // [1, 12]
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// An RFC 3339 timestamp (`2024-05-01T12:34:56.789Z`, or with an offset) as Unix
/// milliseconds; `None` if it is not one.
pub fn parse_rfc3339(v: &str) -> Option<i64> {
    let b = v.as_bytes();
    let digits = |s: &str| -> Option<i64> {
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())
            .flatten()
    };
    let num = |range: std::ops::Range<usize>| digits(v.get(range)?);
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &v[19..];
    let mut ms = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<3}", &frac[..digits.min(3)]);
        ms = padded.parse::<i64>().ok()?;
        rest = &frac[digits..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                // A `+` sent unencoded in a query string arrives as a space.
                b'+' | b' ' => 1,
                b'-' => -1,
                _ => return None,
            };
            let r = rest.as_bytes();
            if r.len() != 6 || r[3] != b':' {
                return None;
            }
            let oh = digits(rest.get(1..3)?)?;
            let om = digits(rest.get(4..6)?)?;
            if oh > 23 || om > 59 {
                return None;
            }
            sign * (oh * 60 + om)
        }
    };
    let days_in_month = match mo {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => return None,
    };
    if d < 1 || d > days_in_month || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + s - offset_min * 60;
    Some(secs * 1000 + ms)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A duration as `agentsaga … --older-than` takes it: a whole number and a unit (ms, s,
/// m, h, d).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad =
        || format!("invalid duration \"{text}\": expected a number and a unit (ms, s, m, h, d)");
    let s = text.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = s.split_at(split);
    if number.is_empty() {
        return Err(bad());
    }
    let n: u64 = number.parse().map_err(|_| bad())?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    let ms = n
        .checked_mul(ms_per_unit)
        .filter(|ms| i64::try_from(*ms).is_ok())
        .ok_or_else(|| format!("invalid duration \"{text}\": too long"))?;
    Ok(Duration::from_millis(ms))
}

/// How far `unix_ms` is from `now_ms`, as a person reads it: `in 2 h 10 min`,
/// `in 45 s`, `in 3 d 4 h`; a time past or within the second is `due now`.
pub fn from_now(unix_ms: i64, now_ms: i64) -> String {
    let secs = (unix_ms - now_ms) / 1000;
    if secs <= 0 {
        return "due now".to_owned();
    }
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("in {s} s"),
        (0, 0, m) => format!("in {m} min"),
        (0, h, 0) => format!("in {h} h"),
        (0, h, m) => format!("in {h} h {m} min"),
        (d, 0, _) => format!("in {d} d"),
        (d, h, _) => format!("in {d} d {h} h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_732_281_777_111), "2024-11-22T13:22:57.111Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn from_now_reads_like_a_person_says_it() {
        let now = 1_000_000_000;
        assert_eq!(from_now(now - 5_000, now), "due now");
        assert_eq!(from_now(now + 999, now), "due now");
        assert_eq!(from_now(now + 45_000, now), "in 45 s");
        assert_eq!(from_now(now + 10 * 60_000 + 3_000, now), "in 10 min");
        assert_eq!(from_now(now + 2 * 3_600_000, now), "in 2 h");
        assert_eq!(
            from_now(now + 2 * 3_600_000 + 10 * 60_000, now),
            "in 2 h 10 min"
        );
        assert_eq!(from_now(now + 3 * 86_400_000, now), "in 3 d");
        assert_eq!(
            from_now(now + 3 * 86_400_000 + 4 * 3_600_000 + 5, now),
            "in 3 d 4 h"
        );
    }
}
