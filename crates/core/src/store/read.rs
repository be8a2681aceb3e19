//! Reads as data: what a hop reads on the hot path, described once for every driver
//! as [`Writes`](crate::write::Writes) describes what it writes.
//!
//! A [`Load`] is "the row of a table by its key, with the rows of a second table that
//! belong to it" (a saga with its steps). Each driver renders it as its lane allows:
//! SQLite as one statement joining the two, run in the round trip that opens a hop
//! ([`Prefetch`]) or alone ([`Load::fetch`]); PostgreSQL as two
//! statements (the row locked first, then its children read with a snapshot taken
//! after the lock), and in its set lane as two statements for all the keys of a batch
//! (the rows locked in key order, so that two batches never deadlock). The caller gets
//! the same [`Loaded`] rows from every driver.

use std::sync::OnceLock;

use uuid::Uuid;

pub use super::prefetch::{Prefetch, Prefetched};

use super::conn::Conn;
use super::row::Row;
use super::write::{Kind, Table};
use crate::Result;
use crate::drivers::on_conn;

/// A row of one table by its key, with the rows of a second that belong to it (see
/// the [module](self)).
///
/// The first table's key is its first column, a UUID ([`Kind::Id`]); the second
/// table's first two columns are that key and the order of its rows. Each side reads
/// the columns named, which the rows then hold under the same names.
#[derive(Debug)]
pub struct Load {
    pub(crate) parent: &'static Table,
    pub(crate) parent_columns: &'static [&'static str],
    pub(crate) child: &'static Table,
    pub(crate) child_columns: &'static [&'static str],
    /// Statements a driver renders once for this load.
    pub(crate) rendered: [OnceLock<String>; 5],
}

/// What a [`Load`] read: the row, and its children in order.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The row of the first table.
    pub parent: Row,
    /// The rows of the second that belong to it, in order.
    pub children: Vec<Row>,
}

impl Load {
    /// The row of `parent` (columns `parent_columns`) with its rows of `child`
    /// (columns `child_columns`).
    pub const fn new(
        parent: &'static Table,
        parent_columns: &'static [&'static str],
        child: &'static Table,
        child_columns: &'static [&'static str],
    ) -> Self {
        Self {
            parent,
            parent_columns,
            child,
            child_columns,
            rendered: [const { OnceLock::new() }; 5],
        }
    }

    /// The parent's key column.
    pub(crate) fn key(&self) -> &'static str {
        self.parent.columns.first().map_or("id", |c| c.name)
    }

    /// The child's column that refers to the parent's key, and the one it is ordered by.
    pub(crate) fn child_key(&self) -> (&'static str, &'static str) {
        let name = |i: usize| self.child.columns.get(i).map_or("", |c| c.name);
        (name(0), name(1))
    }

    /// Is the description what the drivers render: a UUID key, a child with a key
    /// and an order?
    pub(crate) fn check(&self) -> Result<()> {
        let ok = self.parent.columns.first().map(|c| c.kind) == Some(Kind::Id)
            && self.child.columns.first().map(|c| c.kind) == Some(Kind::Id)
            && self.child.columns.len() >= 2;
        if ok {
            Ok(())
        } else {
            Err(crate::Error::Corrupt {
                table: self.parent.name,
                reason: "a load's parent is keyed by its first column, a UUID, and its \
                         child's first two columns are that key and an order"
                    .into(),
            })
        }
    }

    /// Reads the row of `key` with its children through `conn` (in the caller's
    /// transaction: on PostgreSQL the row stays locked until it ends); `None` if there
    /// is no such row.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error;
    /// [`Error::Corrupt`](crate::Error::Corrupt) for a description the drivers do not
    /// render (see [`Load`]).
    pub async fn fetch(&'static self, conn: Conn<'_>, key: Uuid) -> Result<Option<Loaded>> {
        self.check()?;
        on_conn!(conn.0, D, c => D::load(c, self, key).await)
    }
}
