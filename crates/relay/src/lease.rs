//! A delivery's lease as the delivering process sees it: the local time (monotonic:
//! it runs on while the process is frozen) until which the relay surely holds the row,
//! moved on by each renewal.
//!
//! A process frozen past its leases (`SIGSTOP`, a VM paused, a long GC-like stall)
//! learns that it lost them only when its next renewal is answered; until then its
//! deliveries could go on, and an outside call not yet sent could go out late, after
//! another process has taken the row over and maybe undone the step. A [`Lease`]
//! closes that window without a round trip: [`Lease::fence`] polls the work only
//! while the lease holds by the local clock, so from the moment the deadline passes
//! the work makes no progress at all (no request leaves), whichever task the thawed
//! runtime happens to poll first.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// Until when (local, monotonic time) a delivery's row is surely this relay's.
#[derive(Debug, Clone)]
pub struct Lease {
    until: watch::Receiver<Instant>,
}

impl Lease {
    /// A lease the relay moves on (`until` is updated by each renewal).
    pub(crate) fn new(until: watch::Receiver<Instant>) -> Self {
        Self { until }
    }

    /// A lease that never runs out: for a delivery that no relay leased (a transport
    /// called directly, e.g. in a test).
    pub fn unbounded() -> Self {
        // Far enough never to pass, near enough not to overflow `Instant`.
        let (_, until) = watch::channel(Instant::now() + Duration::from_secs(100 * 365 * 86_400));
        Self { until }
    }

    /// Until when the lease surely holds.
    pub fn until(&self) -> Instant {
        *self.until.borrow()
    }

    /// Whether the lease surely holds now.
    pub fn held(&self) -> bool {
        Instant::now() < self.until()
    }

    /// Runs `work` while the lease holds: `work` is polled only while [`held`]
    /// (checked at every poll, before `work`), and `None` is returned at the first
    /// poll after the lease ran out. It does not wake itself when the lease runs out
    /// (the relay's loss signal does that); it guarantees that `work` takes no step
    /// past it.
    ///
    /// [`held`]: Self::held
    pub async fn fence<F: Future>(&self, work: F) -> Option<F::Output> {
        let mut work = pin!(work);
        std::future::poll_fn(|cx| {
            if !self.held() {
                return Poll::Ready(None);
            }
            work.as_mut().poll(cx).map(Some)
        })
        .await
    }
}

tokio::task_local! {
    /// The lease of the delivery the current task runs (set by the relay's worker
    /// around the transport's `deliver`).
    static CURRENT: Lease;
}

/// Runs `f` with `lease` as the current delivery's lease.
pub(crate) async fn scope<F: Future>(lease: Lease, f: F) -> F::Output {
    CURRENT.scope(lease, f).await
}

/// The lease of the delivery the current task runs, or [`Lease::unbounded`] outside a
/// relay's delivery. Transports hand it to what does the work (the in-process
/// transport puts it in [`Deliver::lease`](crate::in_process::Deliver::lease)).
pub fn current() -> Lease {
    CURRENT
        .try_with(Clone::clone)
        .unwrap_or_else(|_| Lease::unbounded())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test]
    async fn work_past_its_lease_takes_no_step() {
        let (tx, rx) = watch::channel(Instant::now() + Duration::from_secs(60));
        let lease = Lease::new(rx);
        assert!(lease.held());
        assert_eq!(lease.fence(async { 7 }).await, Some(7));

        // Past the deadline (as after a freeze): the work is never polled.
        tx.send_replace(Instant::now() - Duration::from_millis(1));
        assert!(!lease.held());
        let polled = Arc::new(AtomicBool::new(false));
        let p = Arc::clone(&polled);
        let out = lease
            .fence(async move {
                p.store(true, Ordering::SeqCst);
            })
            .await;
        assert_eq!(out, None);
        assert!(
            !polled.load(Ordering::SeqCst),
            "the work was polled past its lease"
        );

        // A renewal moves it on.
        tx.send_replace(Instant::now() + Duration::from_secs(60));
        assert!(lease.held());
    }

    #[tokio::test]
    async fn outside_a_delivery_the_lease_is_unbounded() {
        assert!(current().held());
        let (_tx, rx) = watch::channel(Instant::now() - Duration::from_millis(1));
        let inside = scope(Lease::new(rx), async { current().held() }).await;
        assert!(!inside, "the scoped lease is the current one");
    }
}
