//! The seam between the store and its drivers.
//!
//! [`Backend`] is the open database of one driver or the other (`crate::sqlite`,
//! `crate::postgres`): the store matches on it here, in [`on_backend!`] and
//! [`on_conn!`], and in the few places that hand a driver its own work (a hop's turn,
//! a transaction's begin). [`Dialect`] lists every statement of the cold path; each
//! driver implements it (`sqlite::dialect`, `postgres::dialect`), and the compiler
//! keeps them in step: a statement added to one and not the other does not build.
//! What surrounds the SQL (input checks, spans, transactions, notices, batching loops,
//! decoding) is written once, in `store.rs`, `queue.rs`, `admin.rs` and here. A third
//! backend is one more driver folder, one more variant here, its migrations and a
//! feature.

use std::time::Duration;

use sqlx::Row;

use super::admin_types::{DeadQuery, DeadRow, Stats, Table};
use super::config::StoreConfig;
use super::queue_types::{Claim, DeadLetter, Retry};
use super::wake::Wakeups;
use crate::{Envelope, Error, Integer, Message, MessageId, Result};

/// The open database, of one backend or the other.
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    #[cfg(feature = "sqlite")]
    Sqlite(crate::sqlite::Sqlite),
    #[cfg(feature = "postgres")]
    Postgres(crate::postgres::Postgres),
}

impl Backend {
    /// Opens the database at `url` with the driver its scheme names, and the wakeups
    /// of its relays (shared with other processes where the database is).
    pub(crate) async fn open(url: &str, config: &StoreConfig) -> Result<(Self, Wakeups)> {
        let scheme = url.split(':').next().unwrap_or_default();
        let unsupported = |reason: String| {
            Err(Error::InvalidUrl {
                url: url.to_owned(),
                reason,
            })
        };
        match scheme {
            #[cfg(feature = "sqlite")]
            "sqlite" => Ok((
                Backend::Sqlite(crate::sqlite::open(url, config).await?),
                Wakeups::local(),
            )),
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => {
                let pg = crate::postgres::open(url, config).await?;
                let wake = crate::postgres::notify::wakeups(&pg.pool);
                Ok((Backend::Postgres(pg), wake))
            }
            #[cfg(not(feature = "sqlite"))]
            "sqlite" => {
                unsupported("this build has no SQLite backend (the `sqlite` feature is off)".into())
            }
            #[cfg(not(feature = "postgres"))]
            "postgres" | "postgresql" => unsupported(
                "this build has no PostgreSQL backend (the `postgres` feature is off)".into(),
            ),
            "" => unsupported("no scheme: expected sqlite:… or postgres://…".into()),
            other => unsupported(format!(
                "unsupported scheme `{other}`: expected `sqlite` or `postgres`"
            )),
        }
    }
}

/// Runs `$body` with `$b` bound to the backend's dialect, whichever it is.
macro_rules! on_backend {
    ($backend:expr, $b:ident => $body:expr) => {
        match $backend {
            #[cfg(feature = "sqlite")]
            $crate::store::backend::Backend::Sqlite($b) => $body,
            #[cfg(feature = "postgres")]
            $crate::store::backend::Backend::Postgres($b) => $body,
        }
    };
}

/// Runs `$body` with `$c` bound to the connection and `$d` naming its dialect's type.
macro_rules! on_conn {
    ($conn:expr, $d:ident, $c:ident => $body:expr) => {
        match $conn {
            #[cfg(feature = "sqlite")]
            $crate::store::conn::Conn::Sqlite($c) => {
                type $d = $crate::sqlite::Sqlite;
                $body
            }
            #[cfg(feature = "postgres")]
            $crate::store::conn::Conn::Postgres($c) => {
                type $d = $crate::postgres::Postgres;
                $body
            }
        }
    };
}

pub(crate) use {on_backend, on_conn};

/// Every statement of the store, in one dialect. Statements that join the caller's
/// transaction take its connection; the others run on the dialect's pools.
pub(crate) trait Dialect {
    /// The connection type of the caller's transactions.
    type Conn;

    /// Pending rows, counted up to `limit` (and, on PostgreSQL, serialised with other
    /// counting producers until the transaction ends).
    async fn count_pending(c: &mut Self::Conn, limit: u64) -> Result<u64>;
    /// Inserts messages in order; an id already stored is skipped.
    async fn enqueue(c: &mut Self::Conn, messages: &[Message]) -> Result<()>;
    /// Inserts one message already leased to `owner` (in flight, its first attempt),
    /// unless its key has a live row or its id is stored: the row, or `None`.
    async fn enqueue_leased(
        c: &mut Self::Conn,
        message: &Message,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Envelope>>;
    /// Inserts an inbox row; `false` if it was there.
    async fn receive(c: &mut Self::Conn, consumer: &str, id: MessageId) -> Result<bool>;
    /// Deletes still-pending rows by id.
    async fn cancel_pending(c: &mut Self::Conn, ids: &[MessageId]) -> Result<u64>;
    /// Moves rows still leased to `owner` to `dead` with their reasons.
    async fn dead_letter(c: &mut Self::Conn, owner: &str, dead: &[DeadLetter]) -> Result<u64>;
    /// Inserts one message as a dead letter with `reason`, unless its id is stored:
    /// whether it was written.
    async fn enqueue_dead(c: &mut Self::Conn, message: &Message, reason: &str) -> Result<bool>;

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
