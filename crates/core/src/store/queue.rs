//! The relay's protocol over the outbox: claim ready rows under a lease, then
//! acknowledge, retry, dead-letter or release each. Reached through [`Store::queue`].
//!
//! A producer never calls these; `agentsaga-relay` does, and so may a relay of your own.
//! A receiving side (a transport's consumer) writes a message it cannot take straight
//! into the dead letters, with its reason: [`Tx::enqueue_dead`](crate::Tx::enqueue_dead).

mod enqueue_dead;

use std::time::Duration;

use super::Store;
use super::backend::{Dialect, Driver};
pub use super::queue_types::{Claim, DeadLetter, Retry};
pub use super::wake::Wakeups;
use crate::drivers::{on_backend, on_conn, on_tx_driver};
use crate::{Envelope, Message, Result};

/// The relay's side of a [`Store`]: one statement per batch. Cheap to make.
#[derive(Debug, Clone, Copy)]
pub struct Queue<'a> {
    store: &'a Store,
}

impl Store {
    /// The relay's protocol over this store's outbox.
    pub fn queue(&self) -> Queue<'_> {
        Queue { store: self }
    }
}

impl Queue<'_> {
    /// Claims up to `claim.limit` ready rows, oldest first, honouring per-key order: a
    /// keyed row is claimable only when no earlier row of its key is pending and no row
    /// of its key is in flight. On Postgres, rows locked by another claimer are skipped
    /// (`FOR UPDATE SKIP LOCKED`).
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error.
    pub async fn claim(&self, claim: &Claim<'_>) -> Result<Vec<Envelope>> {
        if claim.destinations.is_empty() || claim.limit == 0 {
            return Ok(Vec::new());
        }
        if self.shares_the_writer() {
            return self.in_hop(&[], claim).await.map(|(_, rows)| rows);
        }
        let mut rows = on_backend!(&self.store.backend, b => b.claim(claim).await?);
        rows.sort_by_key(|e| e.seq);
        Ok(rows)
    }

    /// On SQLite, while the consumers' shared transaction is open (see
    /// [`Store::begin`]), the relay's writes join it as a hop rather than wait for the
    /// single writer until it commits; otherwise they run on their own (one statement,
    /// no transaction to begin and commit).
    /// (Only a driver with a single writer, SQLite, has such a lane.)
    fn shares_the_writer(&self) -> bool {
        self.store.hops_running()
    }

    /// Marks `delivered` (if any) and claims (if `claim.limit` > 0), in one hop.
    async fn in_hop(&self, delivered: &[i64], claim: &Claim<'_>) -> Result<(u64, Vec<Envelope>)> {
        let mut hop = self.store.hop().await?;
        let tx: &mut crate::Tx = &mut hop;
        let (n, mut rows) =
            on_tx_driver!(tx.inner, D => D::ack_and_claim_in(tx, delivered, claim).await?);
        hop.commit().await?;
        rows.sort_by_key(|e| e.seq);
        Ok((n, rows))
    }

    /// Marks `delivered` rows delivered (as [`mark_delivered`](Self::mark_delivered)
    /// does, for `claim.owner`), then claims (as [`claim`](Self::claim) does, seeing
    /// those rows delivered): the relay's steady state, in one round trip on PostgreSQL
    /// and two statements back to back on SQLite. Returns how many rows were marked
    /// delivered and the claimed rows.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error; then neither
    /// happened.
    pub async fn ack_and_claim(
        &self,
        delivered: &[i64],
        claim: &Claim<'_>,
    ) -> Result<(u64, Vec<Envelope>)> {
        if delivered.is_empty() {
            return Ok((0, self.claim(claim).await?));
        }
        if self.shares_the_writer() {
            return self.in_hop(delivered, claim).await;
        }
        if claim.destinations.is_empty() || claim.limit == 0 {
            return Ok((
                self.mark_delivered(claim.owner, delivered).await?,
                Vec::new(),
            ));
        }
        let (n, mut rows) =
            on_backend!(&self.store.backend, b => b.ack_and_claim(delivered, claim).await?);
        rows.sort_by_key(|e| e.seq);
        Ok((n, rows))
    }

    /// Marks rows delivered. Only rows still leased to `owner` change (a row whose
    /// lease expired and was taken by another relay is that relay's now). Returns how
    /// many changed.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error.
    pub async fn mark_delivered(&self, owner: &str, seqs: &[i64]) -> Result<u64> {
        if seqs.is_empty() {
            return Ok(0);
        }
        if self.shares_the_writer() {
            let claim = Claim {
                owner,
                destinations: &[],
                limit: 0,
                lease: Duration::ZERO,
            };
            return self.in_hop(seqs, &claim).await.map(|(n, _)| n);
        }
        on_backend!(&self.store.backend, b => b.mark_delivered(owner, seqs).await)
    }

    /// Returns rows to `pending` after a failed attempt, each with its delay and error.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error.
    pub async fn retry_later(&self, owner: &str, retries: &[Retry]) -> Result<u64> {
        if retries.is_empty() {
            return Ok(0);
        }
        on_backend!(&self.store.backend, b => b.retry_later(owner, retries).await)
    }

    /// Moves rows to `dead` with their reason, and enqueues their notices, in one
    /// transaction. A notice is sent only with its row: a row whose lease was lost is
    /// left to its new owner, and its notice is not sent.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error.
    pub async fn dead_letter(&self, owner: &str, dead: &[DeadLetter]) -> Result<u64> {
        if dead.is_empty() {
            return Ok(0);
        }
        let notices: Vec<Message> = dead.iter().filter_map(|d| d.notice.clone()).collect();
        let mut tx = self.store.begin().await?;
        let n = on_conn!(tx.conn().0, D, c => D::dead_letter(c, owner, dead).await?);
        if n == dead.len() as u64 {
            // Notices skip the pending limit: they report on work already admitted.
            let now = self.store.clock().now_ms();
            on_conn!(tx.conn().0, D, c => D::enqueue(c, &notices, now).await?);
            tx.mark_enqueued();
        } else if dead.len() > 1 && !notices.is_empty() {
            tx.rollback().await?;
            // Some rows were lost: one row at a time, so each notice follows its own
            // row (a single row that was lost is committed below, without its notice).
            let mut total = 0;
            for d in dead {
                total += Box::pin(self.dead_letter(owner, std::slice::from_ref(d))).await?;
            }
            return Ok(total);
        }
        tx.commit().await?;
        Ok(n)
    }

    /// Returns claimed rows to `pending` without counting the attempt (graceful
    /// shutdown: they were never handed over).
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error.
    pub async fn release(&self, owner: &str, seqs: &[i64]) -> Result<u64> {
        if seqs.is_empty() {
            return Ok(0);
        }
        on_backend!(&self.store.backend, b => b.release(owner, seqs).await)
    }

    /// Extends the leases of rows still held by `owner` (long deliveries), and answers
    /// which of `seqs` it extended: a row missing from the answer is no longer
    /// `owner`'s (its lease expired and it was reclaimed, or another relay holds it),
    /// and its delivery must stop.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error.
    pub async fn renew_leases(
        &self,
        owner: &str,
        seqs: &[i64],
        lease: Duration,
    ) -> Result<Vec<i64>> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        on_backend!(&self.store.backend, b => b.renew(owner, seqs, lease).await)
    }

    /// Returns rows whose lease expired (their relay died) to the pool.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error.
    pub async fn reclaim_expired(&self) -> Result<u64> {
        on_backend!(&self.store.backend, b => b.reclaim_expired().await)
    }
}
