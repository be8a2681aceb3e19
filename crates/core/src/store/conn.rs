//! A borrowed connection of the store's driver, and what an inbox record found.

use crate::drivers::{ConnOf, ReaderOf};

/// A borrowed connection of the store's driver, usually the inside of a transaction
/// ([`Tx::conn`](crate::Tx::conn)). A `&mut` connection of sqlx (`&mut *tx` of your own
/// `sqlx::Transaction`) converts into it, so the outbox joins your transaction; run
/// your own statements on it with [`Sql`](crate::Sql), or take the driver's
/// connection back out (`into_sqlite`, `into_postgres`).
///
/// It carries the store's [`Clock`](crate::clock::Clock) (a connection of your own
/// carries the system's), which [`Sql`](crate::Sql)'s `{now_ms}` and `{clock_ms}` read
/// on SQLite.
#[derive(Debug)]
pub struct Conn<'a>(pub(crate) ConnOf<'a>, pub(crate) &'a crate::clock::Clock);

impl Conn<'_> {
    /// The same connection, borrowed again: to run statements on it one after
    /// another.
    pub fn reborrow(&mut self) -> Conn<'_> {
        Conn(self.0.reborrow(), self.1)
    }

    /// The name of its driver: `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        crate::drivers::on_conn!(&self.0, D, _c => D::NAME)
    }

    /// Takes the lock `name` until the transaction ends, so that transactions that
    /// take it take turns: on PostgreSQL a transaction advisory lock; on SQLite
    /// nothing, its single writer serialises writers already.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error.
    pub async fn lock(&mut self, name: &str) -> crate::Result<()> {
        crate::drivers::on_conn!(self.0.reborrow(), D, c => D::lock(c, name).await)
    }
}

/// A pool to read with, for code that runs its own queries (with [`Sql`](crate::Sql),
/// or the driver's pool taken out: `sqlite`, `postgres`). On a SQLite file its
/// connections are read-only; writes go through [`Store::begin`](crate::Store::begin).
#[derive(Clone, Copy, Debug)]
pub struct ReadPool<'a>(pub(crate) ReaderOf<'a>, pub(crate) &'a crate::clock::Clock);

impl ReadPool<'_> {
    /// The name of its driver: `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        crate::drivers::on_reader!(self.0, D, _p => D::NAME)
    }
}

/// An `integer` column of any driver, as an `i64` (SQLite stores 64 bits, PostgreSQL's
/// `integer` 32): each driver decodes it (`row.try_get::<Integer, _>("attempts")?.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Integer(pub(crate) i64);

/// What [`Store::receive`](crate::Store::receive) found in the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipt {
    /// First time this consumer sees this message: process it.
    First,
    /// Seen before: skip it, and do not answer it again.
    Duplicate,
}
