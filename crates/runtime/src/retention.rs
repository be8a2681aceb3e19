//! Retention: what the runtime deletes on a schedule so that its tables do not grow
//! forever. Each prune runs in bounded batches (never a long write lock on SQLite).

use std::time::Duration;

use agentsaga_core::Store;
use tokio::task::JoinHandle;

/// How long the runtime keeps what it no longer needs. Delivered outbox rows and inbox
/// records are pruned by default; finished sagas only when asked
/// ([`finished_sagas`](Self::finished_sagas)), since operators read them.
///
/// ```
/// use std::time::Duration;
/// use agentsaga_runtime::Retention;
///
/// let r = Retention::default().finished_sagas(Some(Duration::from_secs(30 * 86_400)));
/// assert_eq!(r.delivered, Some(Duration::from_secs(3600)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// Delivered outbox rows older than this are deleted (default 1 hour).
    pub delivered: Option<Duration>,
    /// Inbox records older than this are deleted (default 7 days). It must outlast
    /// any redelivery (a lease per attempt plus the retry backoff), or a late
    /// duplicate would be processed again: the runtime refuses a shorter one. Time the
    /// processes were down counts too: the record of a message whose outbox row in
    /// this database is still pending, in flight or dead is never deleted, however
    /// old (its redelivery may come after a restart).
    pub inbox: Option<Duration>,
    /// Sagas that finished (completed, compensated, aborted) longer ago than this are
    /// deleted with their steps and dead letters (default: kept).
    pub finished_sagas: Option<Duration>,
    /// How often to prune (default every minute).
    pub every: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            delivered: Some(Duration::from_secs(3600)),
            inbox: Some(Duration::from_secs(7 * 86_400)),
            finished_sagas: None,
            every: Duration::from_secs(60),
        }
    }
}

impl Retention {
    /// Keeps everything: no pruning at all.
    pub fn off() -> Self {
        Self {
            delivered: None,
            inbox: None,
            finished_sagas: None,
            every: Duration::from_secs(60),
        }
    }

    /// Sets [`delivered`](Self::delivered).
    #[must_use]
    pub fn delivered(mut self, age: Option<Duration>) -> Self {
        self.delivered = age;
        self
    }

    /// Sets [`inbox`](Self::inbox).
    #[must_use]
    pub fn inbox(mut self, age: Option<Duration>) -> Self {
        self.inbox = age;
        self
    }

    /// Sets [`finished_sagas`](Self::finished_sagas).
    #[must_use]
    pub fn finished_sagas(mut self, age: Option<Duration>) -> Self {
        self.finished_sagas = age;
        self
    }

    /// Sets [`every`](Self::every).
    #[must_use]
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    fn is_off(&self) -> bool {
        self.delivered.is_none() && self.inbox.is_none() && self.finished_sagas.is_none()
    }
}

/// The longest a message can still be delivered again after it was first received
/// (see [`RelayConfig::redelivery_window`](agentsaga_relay::RelayConfig::redelivery_window)).
pub(crate) fn redelivery_window(relay: &agentsaga_relay::RelayConfig) -> Duration {
    relay.redelivery_window()
}

/// Starts the pruning task, unless everything is kept.
pub(crate) fn spawn(store: Store, retention: Retention) -> Option<JoinHandle<()>> {
    if retention.is_off() {
        return None;
    }
    Some(tokio::spawn(async move {
        loop {
            tokio::time::sleep(retention.every).await;
            prune(&store, &retention).await;
        }
    }))
}

async fn prune(store: &Store, r: &Retention) {
    if let Some(age) = r.delivered {
        match store.admin().prune_delivered(age).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(rows = n, "pruned delivered outbox rows"),
            Err(e) => tracing::warn!(error = %e, "pruning delivered outbox rows failed"),
        }
    }
    if let Some(age) = r.inbox {
        match store.admin().prune_inbox(age).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(rows = n, "pruned inbox records"),
            Err(e) => tracing::warn!(error = %e, "pruning inbox records failed"),
        }
    }
    if let Some(age) = r.finished_sagas {
        match agentsaga_saga::query::prune_finished(store, age).await {
            Ok(p) if p.sagas == 0 => {}
            Ok(p) => {
                tracing::debug!(
                    sagas = p.sagas,
                    dead_letters = p.dead_letters,
                    "pruned finished sagas"
                );
            }
            Err(e) => tracing::warn!(error = %e, "pruning finished sagas failed"),
        }
    }
}
