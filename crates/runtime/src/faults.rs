//! Faults a test injects, and what it observes (feature `testing`): what the next
//! deliveries to a destination do instead of reaching its agent
//! ([`TestRuntime::fail_next`]), random faults drawn from a seed
//! ([`RandomFaults`](crate::testing::RandomFaults)), and the journal of the effects the
//! agents committed ([`TestRuntime::ledger`]). The agent actors take the faults
//! (`actors/faults.rs`): a faulted delivery is answered as the agent's failure would be,
//! recorded in the inbox with its reply, in a hop of its own, so the saga sees exactly
//! what a failing agent would have sent.
//!
//! [`TestRuntime::fail_next`]: crate::testing::TestRuntime::fail_next
//! [`TestRuntime::ledger`]: crate::testing::TestRuntime::ledger

#[cfg(feature = "testing")]
mod observed;

#[cfg(feature = "testing")]
pub use observed::{Action, Entry};
#[cfg(feature = "testing")]
pub(crate) use observed::{Chaos, Journal};

#[cfg(feature = "testing")]
use std::collections::{HashMap, HashSet, VecDeque};
#[cfg(feature = "testing")]
use std::sync::Mutex;
#[cfg(feature = "testing")]
use std::sync::atomic::{AtomicBool, Ordering};

/// The faults waiting for their deliveries, shared by a runtime's agents. Empty, and
/// never looked at, in a build without the `testing` feature.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// Whether any fault waits or may be drawn: one atomic load per delivery when
    /// none does.
    #[cfg(feature = "testing")]
    armed: AtomicBool,
    #[cfg(feature = "testing")]
    queued: Mutex<HashMap<String, VecDeque<Fault>>>,
    /// Random faults from a seed, if a test asked for them.
    #[cfg(feature = "testing")]
    chaos: Mutex<Option<Chaos>>,
    /// Destinations whose link a test cut: nothing reaches them.
    #[cfg(feature = "testing")]
    cut: Mutex<HashSet<String>>,
    /// Deliveries in flight that wait on the clock (a rate-limit slot), each with when
    /// (clock ms) it ends: timers a test runtime moves the clock to.
    #[cfg(feature = "testing")]
    waits: Mutex<Vec<(u64, i64)>>,
    #[cfg(feature = "testing")]
    next_wait: std::sync::atomic::AtomicU64,
    /// The effects the agents committed, in commit order (a test runtime's only).
    #[cfg(feature = "testing")]
    pub(crate) journal: Journal,
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
        let mut queued = lock(&self.queued);
        queued
            .entry(destination.to_owned())
            .or_default()
            .extend(std::iter::repeat_n(fault.clone(), n));
        self.armed.store(true, Ordering::Release);
    }

    /// Draws every later saga delivery's fault from `chaos` (after the queued ones).
    pub(crate) fn randomly(&self, chaos: Chaos) {
        *lock(&self.chaos) = Some(chaos);
        self.armed.store(true, Ordering::Release);
    }

    /// How many faults the random draw has made so far, by kind.
    pub(crate) fn drawn(&self) -> Vec<(String, u64)> {
        lock(&self.chaos)
            .as_ref()
            .map(Chaos::drawn)
            .unwrap_or_default()
    }

    /// Cuts (`true`) or mends the link to `destination`.
    pub(crate) fn cut(&self, destination: &str, cut: bool) {
        let mut links = lock(&self.cut);
        if cut {
            links.insert(destination.to_owned());
        } else {
            links.remove(destination);
        }
        drop(links);
        if cut {
            self.rearm();
        }
    }

    /// Whether a test cut the link to `destination`.
    pub(crate) fn is_cut(&self, destination: &str) -> bool {
        self.armed.load(Ordering::Acquire) && lock(&self.cut).contains(destination)
    }

    /// The fault of this delivery of `env`, if one waits or is drawn.
    pub(crate) fn take(&self, env: &agentsaga_core::Envelope) -> Option<Fault> {
        if !self.armed.load(Ordering::Acquire) {
            return None;
        }
        if let Some(fault) = self.queued_for(&env.destination) {
            return Some(fault);
        }
        lock(&self.chaos).as_mut().and_then(|c| c.draw(env))
    }

    fn queued_for(&self, destination: &str) -> Option<Fault> {
        let mut queued = lock(&self.queued);
        let faults = queued.get_mut(destination)?;
        let fault = faults.pop_front();
        if faults.is_empty() {
            queued.remove(destination);
        }
        fault
    }

    /// A delivery in flight waits on the clock until `until_ms`, while the guard lives.
    pub(crate) fn waiting(&self, until_ms: i64) -> Waiting<'_> {
        let id = self.next_wait.fetch_add(1, Ordering::Relaxed);
        lock(&self.waits).push((id, until_ms));
        Waiting { faults: self, id }
    }

    /// How many deliveries in flight wait on the clock, and the earliest end of a wait.
    pub(crate) fn waits(&self) -> (usize, Option<i64>) {
        let waits = lock(&self.waits);
        (waits.len(), waits.iter().map(|(_, until)| *until).min())
    }

    /// Armed once a test has queued a fault, drawn random ones or cut a link, and
    /// armed for good: clearing it again would race with a fault armed meanwhile (and
    /// only a test runtime ever arms it).
    fn rearm(&self) {
        self.armed.store(true, Ordering::Release);
    }
}

/// Locks `m`, a poisoned lock included (what it guards stays consistent: every
/// change under it is one statement).
#[cfg(feature = "testing")]
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A delivery's wait on the clock, noted for a test runtime while it lives
/// ([`Faults::waiting`]).
#[cfg(feature = "testing")]
pub(crate) struct Waiting<'a> {
    faults: &'a Faults,
    id: u64,
}

#[cfg(feature = "testing")]
impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.faults.waits).retain(|(id, _)| *id != self.id);
    }
}
