//! A test hook for crash tests, compiled only with the `testing` feature and off until a
//! test program arms it with
//! [`testing::stop_at_shared_commit`](crate::testing::stop_at_shared_commit): past the
//! first `skip` shared transactions holding at least `n` hops, the next one stops its
//! lane just before (or just after) its commit, forever, and says so on stderr, so that
//! a test can `kill -9` the process there. Nothing reads the environment: in a build
//! without `testing` the hook is not there at all.

pub(crate) use super::crash_point::At;

#[cfg(feature = "testing")]
static ARMED: std::sync::OnceLock<(At, usize, usize)> = std::sync::OnceLock::new();

/// Arms the hook from `before:<n>[:<skip>]` or `after:<n>[:<skip>]`, once per process.
#[cfg(feature = "testing")]
pub(crate) fn arm(spec: &str) -> Result<(), String> {
    let bad = || format!("`{spec}`: expected before:<n>[:<skip>] or after:<n>[:<skip>]");
    let mut parts = spec.split(':');
    let at = match parts.next() {
        Some("before") => At::Before,
        Some("after") => At::After,
        _ => return Err(bad()),
    };
    let n = parts.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
    let skip = match parts.next() {
        Some(skip) => skip.parse().map_err(|_| bad())?,
        None => 0,
    };
    if parts.next().is_some() {
        return Err(bad());
    }
    ARMED
        .set((at, n, skip))
        .map_err(|_| "the crash hook is armed already".to_owned())
}

/// Stops forever here if the hook is armed for `at` and `hops` reaches its count.
pub(crate) async fn stop_if(at: At, hops: usize) {
    #[cfg(feature = "testing")]
    {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static SEEN: AtomicUsize = AtomicUsize::new(0);
        let Some(&(when, n, skip)) = ARMED.get() else {
            return;
        };
        if when != at || hops < n || SEEN.fetch_add(1, Ordering::SeqCst) != skip {
            return;
        }
        let at = match at {
            At::Before => "before",
            At::After => "after",
        };
        eprintln!("crash hook: stopped {at} the shared commit of {hops} hops");
        std::future::pending::<()>().await;
    }
    #[cfg(not(feature = "testing"))]
    let _ = (at, hops);
}

#[cfg(feature = "testing")]
impl crate::Store {
    /// (feature `testing`) The `k`-th shared commit of hops from now (SQLite's lane: an
    /// agent's outcome, an orchestrator's turn, one or more hops at a time) never
    /// happens (`after` false), or happens and is never reported to the hops it holds
    /// (`after` true: their messages are not acknowledged): the lane stops there,
    /// forever, and every later hop waits behind it, as if the process had been killed
    /// there. What is left to do is a restart's: stop everything that ran on this store
    /// without waiting for it (its tokio runtime dropped) and open the database again.
    /// `k` = 0 disarms. The lanes' commits are counted (SQLite's lane, PostgreSQL's
    /// set lane); a transaction of its own is not.
    pub fn crash_at_commit(&self, k: u64, after: bool) {
        self.lanes().counts.crash.arm(k, after);
    }

    /// (feature `testing`) Whether the lane has stopped at its crash point.
    pub fn crashed(&self) -> bool {
        self.lanes().counts.crash.reached()
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::{Duration, Instant};

    const CHILD: &str = "AGENTSAGA_CRASH_HOOK_CHILD";

    // Whoever can set a process's environment cannot stop it at a commit: the variable
    // that armed the hook in every build before is read by nothing. The test runs itself
    // again as a child with that variable set, and the child's shared commit of 4 hops
    // must go through (bounded wait: a child stopped there is killed and the test fails).
    #[test]
    fn the_environment_does_not_stop_a_commit() {
        if std::env::var_os(CHILD).is_some() {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(super::stop_if(super::At::Before, 4));
            return;
        }
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "store::crash_hook::tests::the_environment_does_not_stop_a_commit",
            ])
            .env(CHILD, "1")
            .env("AGENTSAGA_TEST_STOP_AT_SHARED_COMMIT", "before:1")
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the environment stopped a commit (the child never finished)");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "the child failed: {status}");
    }
}
