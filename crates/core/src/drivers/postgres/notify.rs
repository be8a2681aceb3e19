//! PostgreSQL's notifications: wakeups passed between processes with `NOTIFY`
//! (debounced, one per burst of commits) and `LISTEN`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;

use crate::store::wake::{Remote, Wakeups};

/// The channel name used for cross-process wakeups.
pub(crate) const NOTIFY_CHANNEL: &str = "agentsaga_outbox";

/// The wakeups of a store on `pool`: local ones, passed on to other processes, and
/// theirs received.
pub(crate) fn wakeups(pool: &PgPool) -> Wakeups {
    let (this, remote) = Wakeups::with_remote();
    tokio::spawn(notifier(remote, pool.clone()));
    tokio::spawn(listener(this.sender(), pool.clone()));
    this
}

/// Sends at most one NOTIFY per `DEBOUNCE` however many commits happened: a NOTIFY
/// inside each business transaction would serialise their commits on a global lock.
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
