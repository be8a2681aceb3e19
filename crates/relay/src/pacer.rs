//! The pacer: the task that turns time and wakeups into claimer messages.
//!
//! It sends `Tick` on every outbox wakeup (a local commit, or a NOTIFY from another
//! process) and every `poll_interval` as the fallback, `Renew` every `lease / 3` and
//! `Reclaim` every `lease / 2`, all on real time (leases are, see
//! [`Clock::lease_now`]); a move of the store's clock by hand (a test's manual clock)
//! also sends a `Tick`, so that what it made due is claimed at once. Each kind is
//! coalesced: while one is waiting in the
//! claimer's mailbox, no second one is sent, so a slow database never builds a backlog
//! of ticks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agentsaga_core::clock::Clock;
use ractor::ActorRef;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior, interval, interval_at};

use crate::claimer::msg::ClaimerMsg;

/// A coalesced signal to the claimer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Signal {
    Tick,
    Renew,
    Reclaim,
}

/// One flag per [`Signal`]: raised when sent, lowered when the claimer takes it.
#[derive(Debug, Default)]
pub(crate) struct Signals([AtomicBool; 3]);

impl Signals {
    fn flag(&self, signal: Signal) -> &AtomicBool {
        &self.0[signal as usize]
    }

    /// Sends `signal` unless one is already waiting. False if the claimer is gone.
    pub(crate) fn post(&self, claimer: &ActorRef<ClaimerMsg>, signal: Signal) -> bool {
        if self.flag(signal).swap(true, Ordering::AcqRel) {
            return true;
        }
        let msg = match signal {
            Signal::Tick => ClaimerMsg::Tick,
            Signal::Renew => ClaimerMsg::Renew,
            Signal::Reclaim => ClaimerMsg::Reclaim,
        };
        claimer.cast(msg).is_ok()
    }

    /// The claimer took `signal`: the next one may be sent.
    pub(crate) fn lower(&self, signal: Signal) {
        self.flag(signal).store(false, Ordering::Release);
    }
}

/// Starts the pacer; it ends when the claimer is gone or the handle is aborted.
pub(crate) fn spawn(
    claimer: ActorRef<ClaimerMsg>,
    signals: Arc<Signals>,
    wake: watch::Receiver<u64>,
    clock: Clock,
    poll_interval: Duration,
    lease: Duration,
) -> JoinHandle<()> {
    tokio::spawn(run(claimer, signals, wake, clock, poll_interval, lease))
}

async fn run(
    claimer: ActorRef<ClaimerMsg>,
    signals: Arc<Signals>,
    mut wake: watch::Receiver<u64>,
    clock: Clock,
    poll_interval: Duration,
    lease: Duration,
) {
    let min = Duration::from_millis(1);
    let mut poll = interval(poll_interval.max(min));
    // Reclaim at once: rows of a relay that died before this one started are waiting.
    let mut reclaim = interval((lease / 2).max(min));
    let renew_every = (lease / 3).max(min);
    let mut renew = interval_at(Instant::now() + renew_every, renew_every);
    for timer in [&mut poll, &mut reclaim, &mut renew] {
        timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
    }
    let mut wake_open = true;
    loop {
        let signal = tokio::select! {
            changed = wake.changed(), if wake_open => {
                if changed.is_err() {
                    // The store's wakeups are gone: polling alone from now on.
                    wake_open = false;
                    continue;
                }
                Signal::Tick
            }
            _ = poll.tick() => Signal::Tick,
            () = clock.moved() => Signal::Tick,
            _ = renew.tick() => Signal::Renew,
            _ = reclaim.tick() => Signal::Reclaim,
        };
        if !signals.post(&claimer, signal) {
            return;
        }
    }
}
