//! SQLite's WAL checkpoints, mostly off the writer's path.
//!
//! In WAL mode every commit appends pages to the `-wal` file, and a *checkpoint* copies
//! them back into the database file (syncing both) so that the WAL can start over. By
//! default SQLite runs one inside the commit that takes the WAL past 1,000 pages: on
//! the single writer connection, so every hop queued behind that commit waits for the
//! copy and its two syncs.
//!
//! So each commit pokes a task of the store's own, which runs a `PASSIVE` checkpoint
//! (it blocks no writer and no reader) on a connection of its own, at most every
//! [`INTERVAL`] and not at all while nothing is written. A checkpoint that caught up
//! with the WAL lets the next write transaction start the WAL over. Under writes that
//! never pause it rarely catches up, so the writer keeps a checkpoint of its own at
//! [`WRITER_PAGES`] pages of WAL (four times SQLite's default): it finds most pages
//! copied already, and it bounds the WAL should the task fall behind or be gone (its
//! runtime stopped, its connection failing). In the saga bench this made SQLite about
//! 8 % faster than the writer checkpointing alone at the default threshold (2 % of it
//! from the threshold).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sqlx::ConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;
use tokio::sync::Notify;

/// The least time between two background checkpoints while writes go on.
pub(crate) const INTERVAL: Duration = Duration::from_millis(50);

/// The writer's own checkpoint threshold (SQLite's `wal_autocheckpoint`, in pages):
/// far past what the task lets the WAL reach between two of its checkpoints.
pub(crate) const WRITER_PAGES: u32 = 4_000;

/// The background checkpointer of one database: poked by commits, stopped when the last
/// clone of its store is dropped or the store is closed.
#[derive(Clone, Debug)]
pub(crate) struct Checkpointer {
    handle: Arc<Handle>,
}

/// Stops the task when dropped (the store's last clone went away).
#[derive(Debug)]
struct Handle {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    poke: Notify,
    closed: AtomicBool,
    /// Checkpoints that found pages to copy.
    copied: AtomicU64,
}

impl Checkpointer {
    /// Starts the task, which connects with `options` (the writer's) on first need.
    pub(crate) fn start(options: SqliteConnectOptions) -> Self {
        let shared = Arc::new(Shared::default());
        tokio::spawn(run(options, Arc::clone(&shared)));
        Self {
            handle: Arc::new(Handle { shared }),
        }
    }

    /// A commit appended to the WAL: checkpoint soon.
    pub(crate) fn poke(&self) {
        self.handle.shared.poke.notify_one();
    }

    /// Stops the task (the store is closing).
    pub(crate) fn stop(&self) {
        self.handle.stop();
    }

    /// Background checkpoints that copied pages, so far.
    #[cfg(test)]
    pub(crate) fn copied(&self) -> u64 {
        self.handle.shared.copied.load(Ordering::Relaxed)
    }
}

impl Handle {
    fn stop(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.poke.notify_one();
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn run(options: SqliteConnectOptions, shared: Arc<Shared>) {
    let mut conn = None;
    loop {
        shared.poke.notified().await;
        if shared.closed.load(Ordering::Acquire) {
            break;
        }
        if conn.is_none() {
            match options.connect().await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::debug!(error = %e, "the checkpointer could not connect; the writer checkpoints meanwhile");
                }
            }
        }
        if let Some(c) = conn.as_mut() {
            // (busy, pages in the WAL, pages of it in the database file)
            match sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(PASSIVE)")
                .fetch_one(&mut *c)
                .await
            {
                Ok((_, _, copied)) if copied > 0 => {
                    shared.copied.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "a background checkpoint failed; the writer checkpoints meanwhile");
                    conn = None;
                }
            }
        }
        tokio::time::sleep(INTERVAL).await;
    }
    if let Some(c) = conn {
        let _ = sqlx::Connection::close(c).await;
    }
}
