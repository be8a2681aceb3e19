//! Faults a test injects (feature `testing`, [`TestRuntime::fail_next`]): what the next
//! deliveries to a destination do instead of reaching its agent, queued per
//! destination. The agent actors take them (`actors/faults.rs`): a faulted delivery is
//! answered as the agent's failure would be, recorded in the inbox with its reply, in a
//! hop of its own, so the saga sees exactly what a failing agent would have sent.
//!
//! [`TestRuntime::fail_next`]: crate::testing::TestRuntime::fail_next

#[cfg(feature = "testing")]
use std::collections::{HashMap, VecDeque};
#[cfg(feature = "testing")]
use std::sync::Mutex;
#[cfg(feature = "testing")]
use std::sync::atomic::{AtomicBool, Ordering};

/// The faults waiting for their deliveries, shared by a runtime's agents. Empty, and
/// never looked at, in a build without the `testing` feature.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// Whether any fault waits: one atomic load per delivery when none does.
    #[cfg(feature = "testing")]
    armed: AtomicBool,
    #[cfg(feature = "testing")]
    queued: Mutex<HashMap<String, VecDeque<Fault>>>,
}

/// (feature `testing`) What a delivery to a destination does instead of reaching its
/// agent ([`TestRuntime::fail_next`](crate::testing::TestRuntime::fail_next)). It
/// applies to the next deliveries to the destination, whatever they carry (a command,
/// a retry, a compensation).
#[cfg(feature = "testing")]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The agent fails retryably with this error: the step's retry policy applies.
    Retryable(String),
    /// The agent fails for good with this error: before the pivot the saga
    /// compensates, after it the step is stuck.
    Fatal(String),
    /// The agent's work runs past the step's timeout (as if the clock had passed it).
    TimedOut,
    /// The message is refused as unprocessable: dead-lettered with this reason, and
    /// the saga told.
    DeadLetter(String),
    /// The message reaches the agent, then reaches it again as a redelivery (its next
    /// attempt), as after a relay lost the first delivery's outcome: the inbox keeps
    /// its effects and its answer to one.
    Twice,
}

#[cfg(feature = "testing")]
impl Faults {
    /// The next `n` deliveries to `destination` (after those already faulted) do
    /// `fault`.
    pub(crate) fn push(&self, destination: &str, n: usize, fault: &Fault) {
        if n == 0 {
            return;
        }
        let mut queued = self
            .queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        queued
            .entry(destination.to_owned())
            .or_default()
            .extend(std::iter::repeat_n(fault.clone(), n));
        self.armed.store(true, Ordering::Release);
    }

    /// The fault of this delivery to `destination`, if one waits.
    pub(crate) fn take(&self, destination: &str) -> Option<Fault> {
        if !self.armed.load(Ordering::Acquire) {
            return None;
        }
        let mut queued = self
            .queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let faults = queued.get_mut(destination)?;
        let fault = faults.pop_front();
        if faults.is_empty() {
            queued.remove(destination);
        }
        if queued.is_empty() {
            self.armed.store(false, Ordering::Release);
        }
        fault
    }
}
