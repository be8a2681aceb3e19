//! When a step that waits by time wakes (`Step::sleep`, `Step::sleep_until`,
//! `Step::or_after`): what `StepDef` holds, and the bounds of a time.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::Result;

/// Computes a wake-up time (Unix ms) from the saga data.
pub(crate) type AtFn = Arc<dyn Fn(&Value) -> Result<i64> + Send + Sync>;

/// When a sleeping step (or a wait that ends by time) wakes.
#[derive(Clone)]
pub(crate) enum Wake {
    /// This long after the saga reaches the step.
    After(Duration),
    /// At the Unix time (milliseconds) computed from the saga data when the saga
    /// reaches the step; a time already past wakes at once.
    At(AtFn),
}

/// The longest a step sleeps: ten years. A later time (a `Duration::MAX`, a far
/// `sleep_until`) wakes it then, a time both backends store.
pub(crate) const MAX_SLEEP: Duration = Duration::from_secs(10 * 366 * 86_400);

impl Wake {
    /// The Unix time (ms) the step wakes at, reached at `now_ms` with `data`: at most
    /// [`MAX_SLEEP`] from now.
    pub(crate) fn due_ms(&self, now_ms: i64, data: &Value) -> Result<i64> {
        let latest = now_ms.saturating_add(agentsaga_core::clock::millis(MAX_SLEEP));
        let due = match self {
            Wake::After(d) => now_ms.saturating_add(agentsaga_core::clock::millis(*d)),
            Wake::At(at) => at(data)?,
        };
        Ok(due.min(latest))
    }
}

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wake::After(d) => f.debug_tuple("After").field(d).finish(),
            Wake::At(_) => f.write_str("At(..)"),
        }
    }
}

/// A time as Unix milliseconds (before 1970: negative; far beyond: saturated; the
/// engine wakes a step at most [`MAX_SLEEP`] from when it reaches it).
pub(crate) fn unix_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => agentsaga_core::clock::millis(d),
        Err(e) => agentsaga_core::clock::millis(e.duration()).saturating_neg(),
    }
}
