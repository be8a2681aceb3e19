//! The operator's calls: outbox counts, dead letters, re-drives and retention.
//! Reached through [`Store::admin`]; the CLI is built on them.

use std::time::Duration;

use super::Store;
use super::admin_types::Table;
pub use super::admin_types::{DeadQuery, DeadRow, DestinationRows, Stats};
use super::backend::Dialect;
use super::sql::Sql;
use crate::drivers::on_backend;
use crate::{Error, MessageId, Result};

/// Rows deleted per statement when pruning: each batch is its own short write, so
/// pruning a large backlog never holds SQLite's write lock for long.
const PRUNE_BATCH: i64 = 1000;

/// The operator's side of a [`Store`]. Cheap to make.
#[derive(Debug, Clone, Copy)]
pub struct Admin<'a> {
    store: &'a Store,
}

impl Store {
    /// The operator's calls on this store.
    pub fn admin(&self) -> Admin<'_> {
        Admin { store: self }
    }
}

impl Admin<'_> {
    /// Counts by state and the lag.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn stats(&self) -> Result<Stats> {
        on_backend!(&self.store.backend, b => b.stats().await)
    }

    /// The rows pending or in flight, per destination (those with any), by
    /// destination: what waits on this side of each (a remote destination's, for the
    /// link to publish). Reads every row waiting, as [`stats`](Self::stats) does.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn waiting_by_destination(&self) -> Result<Vec<DestinationRows>> {
        // One statement both dialects read alike.
        const SQL: &str = "SELECT destination,
                sum(CASE WHEN state = 'pending' THEN 1 ELSE 0 END) AS pending,
                sum(CASE WHEN state = 'in_flight' THEN 1 ELSE 0 END) AS in_flight,
                sum(CASE WHEN state = 'pending' AND substr(last_error, 1, 12) = 'unavailable:'
                    THEN 1 ELSE 0 END) AS unavailable,
                max(CASE WHEN state = 'pending' AND substr(last_error, 1, 12) = 'unavailable:'
                    THEN last_error END) AS unavailable_reason
             FROM outbox WHERE state IN ('pending', 'in_flight')
             GROUP BY destination ORDER BY destination";
        let rows = Sql::new(SQL).fetch_all(self.store.reader()).await?;
        rows.iter()
            .map(|r| {
                Ok(DestinationRows {
                    destination: r.text("destination")?,
                    pending: r.int("pending")?.max(0) as u64,
                    in_flight: r.int("in_flight")?.max(0) as u64,
                    unavailable: r.int("unavailable")?.max(0) as u64,
                    unavailable_reason: r.opt_text("unavailable_reason")?,
                })
            })
            .collect()
    }

    /// Dead letters, newest first, optionally of one destination.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn dead_letters(
        &self,
        destination: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DeadRow>> {
        let q = DeadQuery {
            destination,
            limit,
            ..DeadQuery::default()
        };
        let (rows, _) = on_backend!(&self.store.backend, b => b.dead_letters(&q).await?);
        Ok(rows)
    }

    /// A page of dead letters, newest first, bounded by rows and bytes (see
    /// [`DeadQuery`]), and whether more follow it (the next page is the one
    /// `before_seq` its last row's seq).
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn dead_letters_page(&self, q: &DeadQuery<'_>) -> Result<(Vec<DeadRow>, bool)> {
        on_backend!(&self.store.backend, b => b.dead_letters(q).await)
    }

    /// One dead letter by its message id, in one indexed read (`None`: no dead letter
    /// with that id).
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn dead_letter(&self, id: MessageId) -> Result<Option<DeadRow>> {
        on_backend!(&self.store.backend, b => b.dead_letter_by_id(id).await)
    }

    /// Re-drives one dead letter: pending again, attempts reset.
    ///
    /// # Errors
    /// [`Error::NotFound`] if `id` is not a dead letter.
    pub async fn redrive(&self, id: MessageId) -> Result<()> {
        let n = on_backend!(&self.store.backend, b => b.redrive(Some(id), None).await?);
        if n == 0 {
            return Err(Error::NotFound {
                what: "dead letter",
                id: id.to_string(),
            });
        }
        self.store.wake();
        Ok(())
    }

    /// Re-drives every dead letter, or those of one destination. Returns how many.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn redrive_all(&self, destination: Option<&str>) -> Result<u64> {
        let n = on_backend!(&self.store.backend, b => b.redrive(None, destination).await?);
        self.store.wake();
        Ok(n)
    }

    /// Deletes one dead letter (say, one whose saga has moved past it).
    ///
    /// # Errors
    /// [`Error::NotFound`] if no dead letter has this id; [`Error::Database`].
    pub async fn purge_dead_letter(&self, id: MessageId) -> Result<()> {
        let n = on_backend!(&self.store.backend, b => b.purge_dead_letter(id).await?);
        if n == 0 {
            return Err(Error::NotFound {
                what: "dead letter",
                id: id.to_string(),
            });
        }
        Ok(())
    }

    /// Deletes delivered rows delivered more than `older_than` ago.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn prune_delivered(&self, older_than: Duration) -> Result<u64> {
        self.prune(Table::Delivered, older_than).await
    }

    /// Deletes dead letters created more than `older_than` ago.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn purge_dead(&self, older_than: Duration) -> Result<u64> {
        self.prune(Table::Dead, older_than).await
    }

    /// Deletes inbox records older than `older_than`. Keep them longer than any
    /// redelivery can take (leases, retries), or a late duplicate is processed again.
    /// The record of a message whose outbox row in this database is still pending, in
    /// flight or dead is never deleted, however old: its delivery may come again (after
    /// a restart that found its lease run out, after a re-drive), so time the processes
    /// were down counts too.
    ///
    /// # Errors
    /// [`Error::Database`] on a database error.
    pub async fn prune_inbox(&self, older_than: Duration) -> Result<u64> {
        self.prune(Table::Inbox, older_than).await
    }

    /// Deletes in batches of [`PRUNE_BATCH`] rows, each its own statement.
    async fn prune(&self, table: Table, older_than: Duration) -> Result<u64> {
        let mut total = 0;
        loop {
            let n = on_backend!(&self.store.backend,
                b => b.prune_batch(table, older_than, PRUNE_BATCH).await?);
            total += n;
            if n < PRUNE_BATCH as u64 {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }
}
