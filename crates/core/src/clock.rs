//! The one clock of agentsaga's own code: Unix milliseconds, and durations in
//! milliseconds. SQLite rows carry these; PostgreSQL rows use the server's `now()`.
//!
//! With the `testing` feature, tests can step this clock in a running process: see
//! `step`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the system clock is before it).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
        .saturating_add(step::offset_ms())
}

/// A duration in whole milliseconds, saturating far below `i64::MAX` so that adding it
/// to a timestamp cannot overflow.
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).map_or(i64::MAX / 4, |ms| ms.min(i64::MAX / 4))
}

/// A test hook that steps [`now_ms`] in a running process, as a step of the system
/// clock would. Off unless the environment variable `AGENTSAGA_TEST_CLOCK_OFFSET_FILE`
/// (`step::VAR`) names a file: its content, a signed number of milliseconds (`30000`,
/// `-5000`), is then added to the clock. A thread started on the clock's first read
/// reads the file again every 5 ms, so a test steps the clock of a child process by
/// rewriting it (write another file and rename it over it: no half-written number is
/// read). A missing file, or one that does not parse, leaves the offset as it was. The
/// variable is read once. Each step is logged (a warning, "the clock stepped").
///
/// Why a hook, and why this one:
/// - Stepping the real clock needs root (`CAP_SYS_TIME`) and steps every process of the
///   machine, the test runner's and its PostgreSQL server's with it; a time namespace
///   moves only the monotonic clocks, not the wall clock.
/// - [`now_ms`] is the only wall-clock read of agentsaga's code, and on SQLite every
///   time in the database (leases, due times, retries, timers) is a value of it: no
///   statement reads SQLite's own clock. An offset here is what a step of the system
///   clock does to agentsaga on SQLite, and like a real step it leaves monotonic time
///   (tokio's timers, `Instant`: step timeouts, the relay's lease deadlines, backoff
///   sleeps) alone. It does not move PostgreSQL's clock, which keeps PostgreSQL's
///   times.
/// - A file, not the variable's value: the step must come while the process runs.
/// - Compiled only with the `testing` feature (which the examples and tests get through
///   the workspace's dev-dependencies): a production build has no way to shift its
///   clock.
#[cfg(feature = "testing")]
pub mod step {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::time::Duration;

    /// The environment variable that names the offset file.
    pub const VAR: &str = "AGENTSAGA_TEST_CLOCK_OFFSET_FILE";

    static OFFSET: AtomicI64 = AtomicI64::new(0);

    /// The offset now, in milliseconds (0 unless the hook is on).
    pub(crate) fn offset_ms() -> i64 {
        static WATCHING: OnceLock<()> = OnceLock::new();
        WATCHING.get_or_init(|| {
            let Some(path) = std::env::var_os(VAR) else {
                return;
            };
            let path = std::path::PathBuf::from(path);
            read(&path);
            let spawned = std::thread::Builder::new()
                .name("agentsaga-test-clock".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(Duration::from_millis(5));
                        read(&path);
                    }
                });
            if let Err(e) = spawned {
                eprintln!("{VAR}: the clock's watcher could not start: {e}");
            }
        });
        OFFSET.load(Ordering::Relaxed)
    }

    fn read(path: &std::path::Path) {
        if let Some(ms) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
        {
            let before = OFFSET.swap(ms, Ordering::Relaxed);
            if before != ms {
                tracing::warn!(offset_ms = ms, was_ms = before, "{VAR}: the clock stepped");
            }
        }
    }
}

#[cfg(not(feature = "testing"))]
mod step {
    /// No hook without the `testing` feature.
    #[inline]
    pub(crate) fn offset_ms() -> i64 {
        0
    }
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
