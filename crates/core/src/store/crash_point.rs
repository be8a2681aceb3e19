//! Where a lane stops for a crash test: [`At`] (before or after its commit), and
//! (feature `testing`) one store's crash point, armed by
//! [`Store::crash_at_commit`](crate::Store::crash_at_commit).

/// Where in the commit to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum At {
    Before,
    After,
}

/// (feature `testing`) One store's crash point: the lane stops before (or just after)
/// the commit a test named, forever, as a process killed there would.
#[cfg(feature = "testing")]
#[derive(Debug, Default)]
pub(crate) struct Point {
    /// Commits left before the one it stops at; 0: not armed.
    left: std::sync::atomic::AtomicU64,
    /// Stop after that commit rather than before it.
    after: std::sync::atomic::AtomicBool,
    /// The commit counted last is the one: stop once it is made.
    stop_after_this: std::sync::atomic::AtomicBool,
    reached: std::sync::atomic::AtomicBool,
}

#[cfg(feature = "testing")]
impl Point {
    /// Names the `k`-th commit from now, to stop before it (or after it).
    pub(crate) fn arm(&self, k: u64, after: bool) {
        use std::sync::atomic::Ordering;
        self.after.store(after, Ordering::Release);
        self.left.store(k, Ordering::Release);
    }

    /// Whether the lane has stopped here.
    pub(crate) fn reached(&self) -> bool {
        self.reached.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Stops forever if the point names this commit, at `at`: called before each
    /// commit of the lane (which counts it) and after each that succeeded.
    pub(crate) async fn stop_if_reached(&self, at: At, hops: usize) {
        use std::sync::atomic::Ordering;
        if self.left.load(Ordering::Acquire) == 0 && !self.stop_after_this.load(Ordering::Acquire) {
            return; // not armed: a load or two per commit
        }
        let stop = match at {
            // An after-crash whose commit failed stops before the next one instead.
            At::Before if self.stop_after_this.swap(false, Ordering::AcqRel) => true,
            At::Before => {
                let counted = self
                    .left
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
                let this = counted == Ok(1);
                let after = self.after.load(Ordering::Acquire);
                self.stop_after_this.store(this && after, Ordering::Release);
                this && !after
            }
            At::After => self.stop_after_this.swap(false, Ordering::AcqRel),
        };
        if stop {
            self.reached.store(true, Ordering::Release);
            tracing::warn!(hops, ?at, "a test's crash point: the lane stops here");
            std::future::pending::<()>().await;
        }
    }
}
