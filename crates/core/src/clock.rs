//! The one clock of agentsaga's own code: Unix milliseconds, and durations in
//! milliseconds. SQLite rows carry these; PostgreSQL rows use the server's `now()`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the system clock is before it).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}

/// A duration in whole milliseconds, saturating far below `i64::MAX` so that adding it
/// to a timestamp cannot overflow.
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).map_or(i64::MAX / 4, |ms| ms.min(i64::MAX / 4))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_saturates() {
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), i64::MAX / 4);
        assert!(now_ms() > 1_700_000_000_000);
    }
}
