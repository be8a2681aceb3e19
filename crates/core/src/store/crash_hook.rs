//! A test hook for crash tests, off unless the environment variable
//! `AGENTSAGA_TEST_STOP_AT_SHARED_COMMIT` is `before:<n>[:<skip>]` or
//! `after:<n>[:<skip>]`: past the first `skip` (default 0) shared transactions holding
//! at least `n` hops, the next one stops its lane just before (or just after) its
//! commit, forever, and says so on stderr, so that a test can `kill -9` the process
//! there. Read once; any other value is ignored.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where in the commit to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum At {
    Before,
    After,
}

const VAR: &str = "AGENTSAGA_TEST_STOP_AT_SHARED_COMMIT";

/// (where, at least this many hops, after skipping this many such commits)
fn setting() -> Option<(At, usize, usize)> {
    static SETTING: OnceLock<Option<(At, usize, usize)>> = OnceLock::new();
    *SETTING.get_or_init(|| {
        let value = std::env::var(VAR).ok()?;
        let mut parts = value.split(':');
        let at = match parts.next()? {
            "before" => At::Before,
            "after" => At::After,
            _ => return None,
        };
        let n = parts.next()?.parse().ok()?;
        let skip = match parts.next() {
            Some(skip) => skip.parse().ok()?,
            None => 0,
        };
        Some((at, n, skip))
    })
}

/// Stops forever here if the hook is set for `at` and `hops` reaches its count.
pub(crate) async fn stop_if(at: At, hops: usize) {
    static SEEN: AtomicUsize = AtomicUsize::new(0);
    let Some((when, n, skip)) = setting() else {
        return;
    };
    if when != at || hops < n || SEEN.fetch_add(1, Ordering::SeqCst) != skip {
        return;
    }
    let at = match at {
        At::Before => "before",
        At::After => "after",
    };
    eprintln!("{VAR}: stopped {at} the shared commit of {hops} hops");
    std::future::pending::<()>().await;
}
