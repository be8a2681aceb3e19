//! Wakeups: an enqueue committed in this process wakes its relays at once; on
//! PostgreSQL one debounced NOTIFY per burst wakes the relays of other processes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(feature = "postgres")]
use std::time::Duration;

#[cfg(feature = "postgres")]
use sqlx::PgPool;
use tokio::sync::{Notify, watch};

/// The channel name used for cross-process wakeups on PostgreSQL.
#[cfg(feature = "postgres")]
pub(super) const NOTIFY_CHANNEL: &str = "agentsaga_outbox";

/// A wakeup signal relays wait on. Cloning shares it.
#[derive(Clone, Debug)]
pub struct Wakeups {
    tx: Arc<watch::Sender<u64>>,
    remote: Option<Arc<Remote>>,
}

#[derive(Debug)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))] // built by `postgres()` only
struct Remote {
    dirty: AtomicBool,
    kick: Notify,
}

impl Wakeups {
    #[cfg(feature = "sqlite")]
    pub(super) fn local() -> Self {
        Self {
            tx: Arc::new(watch::channel(0).0),
            remote: None,
        }
    }

    #[cfg(feature = "postgres")]
    pub(super) fn postgres(pool: PgPool) -> Self {
        let this = Self {
            tx: Arc::new(watch::channel(0).0),
            remote: Some(Arc::new(Remote {
                dirty: AtomicBool::new(false),
                kick: Notify::new(),
            })),
        };
        if let Some(remote) = &this.remote {
            tokio::spawn(notifier(Arc::clone(remote), pool.clone()));
            tokio::spawn(listener(Arc::downgrade(&this.tx), pool));
        }
        this
    }

    /// Signals that new messages were committed.
    pub fn wake(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
        if let Some(remote) = &self.remote {
            remote.dirty.store(true, Ordering::Release);
            remote.kick.notify_one();
        }
    }

    /// A receiver that changes on every wakeup (local, or NOTIFY from elsewhere).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

/// Sends at most one NOTIFY per `DEBOUNCE` however many commits happened: a NOTIFY
/// inside each business transaction would serialise their commits on a global lock.
#[cfg(feature = "postgres")]
async fn notifier(remote: Arc<Remote>, pool: PgPool) {
    const DEBOUNCE: Duration = Duration::from_millis(2);
    loop {
        tokio::select! {
            () = remote.kick.notified() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        // Only this task holds it: the store is gone.
        if Arc::strong_count(&remote) == 1 {
            return;
        }
        if !remote.dirty.load(Ordering::Acquire) {
            continue;
        }
        tokio::time::sleep(DEBOUNCE).await;
        remote.dirty.store(false, Ordering::Release);
        if let Err(e) = sqlx::query("SELECT pg_notify('agentsaga_outbox', '')")
            .execute(&pool)
            .await
        {
            tracing::debug!(error = %e, "outbox NOTIFY failed; relays fall back to polling");
        }
    }
}

/// Turns NOTIFYs from other processes into local wakeups.
#[cfg(feature = "postgres")]
async fn listener(tx: std::sync::Weak<watch::Sender<u64>>, pool: PgPool) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if tx.upgrade().is_none() {
            return;
        }
        let mut listener = match sqlx::postgres::PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "LISTEN connection failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        if listener.listen(NOTIFY_CHANNEL).await.is_err() {
            tokio::time::sleep(backoff).await;
            continue;
        }
        backoff = Duration::from_millis(100);
        loop {
            let recv = tokio::time::timeout(Duration::from_secs(1), listener.recv()).await;
            let Some(sender) = tx.upgrade() else { return };
            match recv {
                Ok(Ok(_)) => sender.send_modify(|n| *n = n.wrapping_add(1)),
                Ok(Err(_)) => break,
                Err(_) => {} // timeout: check the store is still alive
            }
        }
    }
}
