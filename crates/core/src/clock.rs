//! The one clock of agentsaga's runtime: every time the runtime reads (wall-clock
//! milliseconds in rows, and the monotonic instants of leases, backoff, breakers, step
//! deadlines, schedules and the relay's polling) comes from a [`Clock`], which a store
//! carries ([`StoreConfig::clock`](crate::StoreConfig::clock),
//! [`Store::clock`](crate::Store::clock)) and every layer above it reads.
//!
//! - [`Clock::system`], the default: the system's wall clock for rows, tokio's
//!   monotonic clock for deadlines.
//! - [`ManualClock`] (feature `testing`): time that moves only when a test moves it
//!   ([`ManualClock::advance`]). Sleeps, step timeouts, saga deadlines, schedules,
//!   retry backoff, circuit breakers' cooldowns and rate limits then happen without
//!   waiting. Leases read the clock too, but its real time
//!   ([`Clock::lease_now`]): they tell a live holder from a dead or frozen one. On
//!   PostgreSQL the database's `now()` follows the manual clock too (a schema of its
//!   own in the test's database), moved by
//!   [`Store::advance_clock`](crate::Store::advance_clock).
//!
//! What is *not* on this clock: the bounds that guard against real I/O stalls (SQLite's
//! busy retries, the lanes' hop watchdog, connect and acquire timeouts, the NOTIFY
//! listener's reconnects, metrics and checkpoint intervals). They measure how long the
//! machine takes, not saga time; moving a manual clock by three days must not time out
//! a commit in progress.
//!
//! SQLite rows carry wall-clock milliseconds of this clock; PostgreSQL rows use the
//! server's `now()` (under a manual clock, the manual clock's time). With the `testing` feature, tests can also step the system clock
//! of a running process: see `step`.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// A monotonic instant of a [`Clock`] (tokio's type: a manual clock's instants are its
/// origin plus the time it was moved by).
pub type Instant = tokio::time::Instant;

/// The system's clock, for what has no store to ask (a connection of the caller's).
pub(crate) static SYSTEM: Clock = Clock::system();

/// The runtime's clock: cheap to clone, shared by a store and everything built on it.
#[derive(Clone, Default)]
pub struct Clock {
    manual: Option<Arc<Manual>>,
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.manual {
            None => f.write_str("Clock::system"),
            Some(m) => write!(f, "Clock::manual(at {} ms)", m.state().wall_ms),
        }
    }
}

/// A manual clock's state: where it stands, on the wall and since its origin.
#[derive(Debug, Clone, Copy)]
struct State {
    wall_ms: i64,
    elapsed: Duration,
}

struct Manual {
    origin: Instant,
    state: Mutex<State>,
    moved: watch::Sender<u64>,
}

impl Manual {
    fn state(&self) -> State {
        *self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Clock {
    /// The system's clock (the default).
    pub const fn system() -> Self {
        Self { manual: None }
    }

    /// Whether this is a [`ManualClock`]'s clock.
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }

    /// Milliseconds since the Unix epoch (0 if the system clock is before it).
    pub fn now_ms(&self) -> i64 {
        match &self.manual {
            None => system_now_ms(),
            Some(m) => m.state().wall_ms,
        }
    }

    /// The monotonic now, for deadlines.
    pub fn now(&self) -> Instant {
        match &self.manual {
            None => Instant::now(),
            Some(m) => later(m.origin, m.state().elapsed),
        }
    }

    /// The monotonic now of leases: real time, for a manual clock too. A lease says
    /// whether its holder is alive (not crashed, not frozen), which only real time
    /// tells; were it on a manual clock, moving the clock an hour would take every
    /// row in flight from a holder that was never away. Equal to [`now`](Self::now) on
    /// the system clock.
    pub fn lease_now(&self) -> Instant {
        Instant::now()
    }

    /// [`lease_now`](Self::lease_now) on the wall: the Unix milliseconds that SQLite's
    /// lease columns (`outbox.lease_until`) are written and compared in. Equal to
    /// [`now_ms`](Self::now_ms) on the system clock.
    pub fn lease_now_ms(&self) -> i64 {
        system_now_ms()
    }

    /// [`now_ms`](Self::now_ms) and [`lease_now_ms`](Self::lease_now_ms) together, for
    /// a write that needs both: the system clock is read once (they are the same).
    pub fn now_and_lease_ms(&self) -> (i64, i64) {
        let now = self.now_ms();
        (
            now,
            if self.is_manual() {
                system_now_ms()
            } else {
                now
            },
        )
    }

    /// Waits until `at` on this clock.
    pub async fn sleep_until(&self, at: Instant) {
        let Some(m) = &self.manual else {
            return tokio::time::sleep_until(at).await;
        };
        // Subscribe before looking, so that a move between the look and the wait wakes.
        let mut moved = m.moved.subscribe();
        while later(m.origin, m.state().elapsed) < at {
            if moved.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Waits `d` on this clock.
    pub async fn sleep(&self, d: Duration) {
        self.sleep_until(later(self.now(), d)).await;
    }

    /// `work`'s output, or `None` if `d` passes on this clock first.
    pub async fn timeout<F: Future>(&self, d: Duration, work: F) -> Option<F::Output> {
        self.timeout_at(later(self.now(), d), work).await
    }

    /// `work`'s output, or `None` if this clock reaches `at` first.
    pub async fn timeout_at<F: Future>(&self, at: Instant, work: F) -> Option<F::Output> {
        if self.manual.is_none() {
            return tokio::time::timeout_at(at, work).await.ok();
        }
        tokio::select! {
            biased;
            out = work => Some(out),
            () = self.sleep_until(at) => None,
        }
    }

    /// Resolves when a manual clock moves; never for the system clock. Pollers wait on
    /// it beside their interval, so that moving a manual clock wakes them at once.
    pub async fn moved(&self) {
        match &self.manual {
            None => std::future::pending().await,
            Some(m) => {
                let mut moved = m.moved.subscribe();
                if moved.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

/// A clock that moves only when told (feature `testing`): hand its
/// [`clock`](Self::clock) to [`StoreConfig::clock`](crate::StoreConfig::clock), then
/// [`advance`](Self::advance) it. It never goes back.
#[cfg(feature = "testing")]
#[derive(Clone, Debug)]
pub struct ManualClock(Clock);

#[cfg(feature = "testing")]
impl ManualClock {
    /// A clock that stands at `start_ms` (Unix milliseconds) until moved.
    pub fn new(start_ms: i64) -> Self {
        let (moved, _) = watch::channel(0);
        Self(Clock {
            manual: Some(Arc::new(Manual {
                origin: Instant::now(),
                state: Mutex::new(State {
                    wall_ms: start_ms,
                    elapsed: Duration::ZERO,
                }),
                moved,
            })),
        })
    }

    /// A clock that stands at the system's now until moved.
    pub fn at_system_now() -> Self {
        Self::new(system_now_ms())
    }

    /// The clock to give a store.
    pub fn clock(&self) -> Clock {
        self.0.clone()
    }

    /// Moves the clock forward by `d`, waking every sleep, timeout and poller of it
    /// whose time has come.
    ///
    /// On PostgreSQL the database keeps a clock of its own under a manual clock: move
    /// both with [`Store::advance_clock`](crate::Store::advance_clock) instead.
    pub fn advance(&self, d: Duration) {
        self.0.advance_manual(d);
    }

    /// Milliseconds since the Unix epoch, on this clock.
    pub fn now_ms(&self) -> i64 {
        self.0.now_ms()
    }
}

#[cfg(feature = "testing")]
impl Clock {
    /// Moves a manual clock forward by `d` (a system clock does not move).
    pub(crate) fn advance_manual(&self, d: Duration) {
        let Some(m) = &self.manual else { return };
        {
            let mut s = m
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            s.wall_ms = s.wall_ms.saturating_add(millis(d));
            s.elapsed = s.elapsed.saturating_add(d);
        }
        m.moved.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// `at + d`, or about thirty years after `at` where that overflows (as tokio's own
/// sleeps do): a duration too long to represent waits "forever", it does not panic.
fn later(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .unwrap_or_else(|| at + Duration::from_secs(86_400 * 365 * 30))
}

/// The system's wall clock, in Unix milliseconds, with the test hook's step (`step`)
/// added. Only [`Clock::system`] and tools that show times (the CLI, the console's
/// "now") read it: the runtime reads its store's [`Clock`].
pub fn system_now_ms() -> i64 {
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

/// A test hook that steps [`system_now_ms`] in a running process, as a step of the system
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
/// - [`system_now_ms`] is the only wall-clock read of agentsaga's code, and on SQLite every
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
        assert!(Clock::system().now_ms() > 1_700_000_000_000);
    }

    #[tokio::test]
    async fn a_manual_clock_moves_only_when_told() {
        let manual = ManualClock::new(1_000);
        let clock = manual.clock();
        assert!(clock.is_manual());
        let t0 = clock.now();
        let day = Duration::from_secs(86_400);
        let sleeper = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep(3 * day).await }
        });
        let timed = tokio::spawn({
            let clock = clock.clone();
            async move { clock.timeout(day, std::future::pending::<()>()).await }
        });
        // Real time passes; the manual clock does not.
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(clock.now_ms(), 1_000);
        assert_eq!(clock.now(), t0);
        assert!(!sleeper.is_finished() && !timed.is_finished());

        manual.advance(day);
        assert_eq!(
            timed.await.unwrap(),
            None,
            "the timeout passed on the clock"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!sleeper.is_finished(), "two days are still to sleep");

        manual.advance(2 * day);
        sleeper.await.unwrap();
        assert_eq!(clock.now_ms(), 1_000 + 3 * 86_400_000);
        assert_eq!(clock.now() - t0, 3 * day);
        // Work that ends first wins.
        assert_eq!(clock.timeout(day, async { 7 }).await, Some(7));
    }

    // A duration too long for an instant waits "forever" instead of panicking, on
    // either clock; a manual clock moved that far still answers.
    #[tokio::test]
    async fn a_duration_past_any_instant_does_not_panic() {
        for clock in [Clock::system(), ManualClock::new(0).clock()] {
            assert_eq!(clock.timeout(Duration::MAX, async { 1 }).await, Some(1));
            let slept = tokio::time::timeout(Duration::from_millis(20), clock.sleep(Duration::MAX));
            assert!(slept.await.is_err(), "still asleep");
        }
        let manual = ManualClock::new(0);
        manual.advance(Duration::MAX);
        let _ = manual.clock().now();
        assert_eq!(manual.now_ms(), i64::MAX / 4);
    }
}
