//! The seam between the store and its drivers: two traits that each driver implements
//! (in its folder), so that the compiler keeps the drivers in step.
//!
//! [`Dialect`] lists every statement of the cold path; [`Driver`] the rest of what a
//! driver owns: its pools, its transactions (begun, ended, written to), its lane (a
//! hop's turn) and its exclusive rights. What surrounds the SQL (input checks, spans,
//! transactions, notices, batching loops, decoding) is written once, in `store.rs`,
//! `queue.rs`, `admin.rs`, `tx.rs`, `hop.rs` and here. The drivers of a build are
//! named in `crate::drivers` alone.

use std::time::Duration;

use sqlx::Row;

use super::admin_types::{DeadQuery, DeadRow, Stats, Table};
use super::prefetch::Prefetch;
use super::queue_types::{Claim, DeadLetter, Retry};
use super::types::{Admitted, Hop, Store, Tx};
use super::write::Writes;
use crate::drivers::{ConnOf, HoldOf, ReaderOf};
use crate::{Envelope, Error, Integer, Message, MessageId, Result};

/// A driver's write transaction: what it does without the store's side of a [`Tx`].
pub(crate) trait DriverTx {
    /// Its connection, for statements.
    fn conn(&mut self) -> ConnOf<'_>;
    /// The next last write may be deferred: whether the store's side defers it.
    fn allow_defer(&mut self) -> bool;
    /// The store ran a statement in it that its lane must guard (its savepoints).
    fn mark_written(&mut self);
    /// Runs one plain statement (a savepoint's) in it.
    async fn execute(&mut self, sql: &'static str) -> Result<()>;
    /// Runs a read in it (on SQLite's lane, on the connection directly).
    async fn read(&mut self, sql: &crate::Sql, now_ms: i64) -> Result<Vec<crate::Row>>;
}

/// The error of a transaction handed to a driver that is not its own (which the
/// dispatch in `crate::drivers` never does).
pub(crate) fn not_mine(driver: &'static str, tx: &Tx) -> Error {
    Error::BackendMismatch {
        store: driver,
        connection: tx.backend(),
    }
}

/// What a driver owns besides its statements: its pools, its transactions, its lane.
/// Implemented by a driver's open database; the functions on a [`Tx`] are called only
/// with a transaction of that driver (else they answer [`not_mine`]).
pub(crate) trait Driver {
    /// Its name: `"sqlite"`, `"postgres"`.
    fn name(&self) -> &'static str;
    /// The pool to read with.
    fn reader(&self) -> ReaderOf<'_>;
    /// Its embedded migrations.
    fn migrator(&self) -> &'static sqlx::migrate::Migrator;
    /// The file of the database, if it is one.
    fn file(&self) -> Option<std::path::PathBuf>;
    /// Begins a write transaction for [`Store::begin`]: a turn in the lane or a
    /// transaction of its own, as the driver sees fit.
    async fn begin(&self, store: &Store) -> Result<Hop>;
    /// Begins a transaction of its own.
    async fn begin_tx(&self, store: &Store) -> Result<Tx>;
    /// A hop's turn in the driver's lane (or a transaction of its own).
    async fn admit(
        &self,
        store: &Store,
        inbox: Option<(String, MessageId)>,
        prefetch: Option<Prefetch>,
    ) -> Result<Admitted>;
    /// A transaction of this database committed.
    fn committed(&self);
    /// Moves the database's own clock to `ms`, where it keeps one under a manual clock
    /// (PostgreSQL's `now()`); nothing where the process's clock is the only one.
    /// Called only for a store on a manual clock (whose connect installed it).
    #[cfg(feature = "testing")]
    async fn set_clock(&self, _ms: i64) -> Result<()> {
        Ok(())
    }
    /// Ends every other session of the database, as the death of the process that
    /// held them would (a server's sessions; nothing for a file, whose locks die with
    /// their handles).
    #[cfg(feature = "testing")]
    async fn end_other_sessions(&self) -> Result<()> {
        Ok(())
    }
    /// Takes the right `name` (checked already), or `None` if someone holds it.
    async fn try_exclusive(&self, store: &Store, name: &str) -> Result<Option<HoldOf>>;

    /// Writes `writes` in it, `last` for a hop's last write.
    async fn write(tx: &mut Tx, writes: Writes, last: bool) -> Result<()>;
    /// Enqueues `messages` (validated) while a handover is installed, some of them
    /// leased to it.
    async fn enqueue_handing(
        tx: &mut Tx,
        store: &Store,
        to: &std::sync::Arc<dyn super::Handover>,
        messages: &[Message],
    ) -> Result<()> {
        tx.enqueue_handing(store, to, messages).await
    }
    /// Marks `delivered` and claims, in the hop `tx` of the driver's lane.
    async fn ack_and_claim_in(
        tx: &mut Tx,
        delivered: &[i64],
        claim: &Claim<'_>,
    ) -> Result<(u64, Vec<Envelope>)>;
    /// Commits it (then the store hands over and wakes).
    async fn commit(tx: Tx) -> Result<()>;
    /// Rolls it back.
    async fn rollback(tx: Tx) -> Result<()>;
}

/// Every statement of the cold path, in one driver's dialect. Statements that join the caller's
/// transaction take its connection; the others run on the dialect's pools.
pub(crate) trait Dialect {
    /// The connection type of the caller's transactions.
    type Conn;

    /// Pending rows, counted up to `limit` (and, on PostgreSQL, serialised with other
    /// counting producers until the transaction ends).
    async fn count_pending(c: &mut Self::Conn, limit: u64) -> Result<u64>;
    /// Inserts messages in order; an id already stored is skipped.
    async fn enqueue(c: &mut Self::Conn, messages: &[Message], now_ms: i64) -> Result<()>;
    /// Inserts one message already leased to `owner` (in flight, its first attempt),
    /// unless its key has a live row or its id is stored: the row, or `None`.
    async fn enqueue_leased(
        c: &mut Self::Conn,
        message: &Message,
        owner: &str,
        lease: Duration,
        now_ms: i64,
        lease_now_ms: i64,
    ) -> Result<Option<Envelope>>;
    /// Inserts an inbox row; `false` if it was there.
    async fn receive(
        c: &mut Self::Conn,
        consumer: &str,
        id: MessageId,
        now_ms: i64,
    ) -> Result<bool>;
    /// Deletes still-pending rows by id.
    async fn cancel_pending(c: &mut Self::Conn, ids: &[MessageId]) -> Result<u64>;
    /// Moves rows still leased to `owner` to `dead` with their reasons.
    async fn dead_letter(c: &mut Self::Conn, owner: &str, dead: &[DeadLetter]) -> Result<u64>;
    /// Inserts one message as a dead letter with `reason`, unless its id is stored:
    /// whether it was written.
    async fn enqueue_dead(
        c: &mut Self::Conn,
        message: &Message,
        reason: &str,
        now_ms: i64,
    ) -> Result<bool>;

    /// Is the inbox row there (committed)?
    async fn seen(&self, consumer: &str, id: MessageId) -> Result<bool>;
    /// Leases up to `claim.limit` ready rows.
    async fn claim(&self, claim: &Claim<'_>) -> Result<Vec<Envelope>>;
    /// Marks `delivered` delivered, then claims.
    async fn ack_and_claim(
        &self,
        delivered: &[i64],
        claim: &Claim<'_>,
    ) -> Result<(u64, Vec<Envelope>)>;
    /// Marks rows still leased to `owner` delivered.
    async fn mark_delivered(&self, owner: &str, seqs: &[i64]) -> Result<u64>;
    /// Returns rows still leased to `owner` to `pending`, each after its delay.
    async fn retry_later(&self, owner: &str, retries: &[Retry]) -> Result<u64>;
    /// Returns rows still leased to `owner` to `pending`, the attempt uncounted.
    async fn release(&self, owner: &str, seqs: &[i64]) -> Result<u64>;
    /// Extends the leases of rows still held by `owner`.
    async fn renew(&self, owner: &str, seqs: &[i64], lease: Duration) -> Result<Vec<i64>>;
    /// Returns rows whose lease expired to `pending`.
    async fn reclaim_expired(&self) -> Result<u64>;
    /// Dead rows (one, or one destination's, or all) back to `pending`.
    async fn redrive(&self, id: Option<MessageId>, destination: Option<&str>) -> Result<u64>;
    /// Deletes one dead row.
    async fn purge_dead_letter(&self, id: MessageId) -> Result<u64>;
    /// Deletes up to `limit` rows of `table` older than `older_than`.
    async fn prune_batch(&self, table: Table, older_than: Duration, limit: i64) -> Result<u64>;
    /// Outbox counts by state and the lag.
    async fn stats(&self) -> Result<Stats>;
    /// Dead rows, newest first.
    async fn dead_letters(&self, q: &DeadQuery<'_>) -> Result<(Vec<DeadRow>, bool)>;
    /// One dead row, by its message id (the unique index on `id`).
    async fn dead_letter_by_id(&self, id: MessageId) -> Result<Option<DeadRow>>;
    /// Closes the pools.
    async fn close(&self);
}

/// Decodes an outbox row (`seq, id, destination, key, payload, headers, attempts,
/// created_at`, the last in Unix milliseconds) of either backend.
pub(crate) fn envelope<'r, R>(row: &'r R) -> Result<Envelope>
where
    R: Row,
    &'static str: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    MessageId: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Integer: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let corrupt = |column: &str, e: &dyn std::fmt::Display| Error::Corrupt {
        table: "outbox",
        reason: format!("{column}: {e}"),
    };
    let headers: String = row.try_get("headers")?;
    Ok(Envelope {
        seq: row.try_get("seq")?,
        id: row
            .try_get("id")
            .map_err(|e| corrupt("id", &e as &dyn std::fmt::Display))?,
        destination: row.try_get("destination")?,
        key: row.try_get("key")?,
        payload: row.try_get("payload")?,
        headers: serde_json::from_str(&headers).map_err(|e| corrupt("headers", &e))?,
        attempts: u32::try_from(row.try_get::<Integer, _>("attempts")?.0.max(0))
            .unwrap_or(u32::MAX),
        created_at_ms: row.try_get("created_at")?,
    })
}

/// Which of `sizes` (each row's seq and size in bytes, newest first, one more than
/// the page's row limit if there are more) a page of `limit` rows and `max_bytes` holds:
/// the rows up to the one that reaches the bound, and always the first (one row is
/// bounded by the largest message the store takes). Their seqs' range, and whether rows
/// are left after them; `None` for no rows.
pub(crate) fn within_bytes(
    sizes: &[(i64, i64)],
    limit: u32,
    max_bytes: usize,
) -> Option<((i64, i64), bool)> {
    let (first, _) = *sizes.first()?;
    let mut total: u64 = 0;
    let mut last = first;
    let mut taken = 0;
    for &(seq, size) in sizes.iter().take(limit as usize) {
        if taken > 0 && total >= max_bytes as u64 {
            break;
        }
        total = total.saturating_add(u64::try_from(size).unwrap_or(0));
        last = seq;
        taken += 1;
    }
    Some(((last.min(first), last.max(first)), sizes.len() > taken))
}

/// A dead letter: the outbox row and its `last_error`.
pub(crate) fn dead_row<'r, R>(row: &'r R) -> Result<DeadRow>
where
    R: Row,
    &'static str: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    MessageId: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Integer: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(DeadRow {
        envelope: envelope(row)?,
        last_error: row.try_get("last_error")?,
    })
}
