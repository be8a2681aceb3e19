//! Writes as data: a hop hands its rows (per table) and its messages to the
//! transaction, and the driver decides how they run.
//!
//! A table that hops write on the hot path is declared once, as a [`Table`] of
//! [`Column`]s with their [`Kind`]s; each driver renders the statements from it: on
//! SQLite one multi-row `INSERT … VALUES` per table, run in the round trip of the
//! messages (or, for a hop's last write, in the round trip that ends the hop); on
//! PostgreSQL one statement for all the tables (data-modifying `WITH`), or, in a hop of
//! the set lane, the rows kept and written with the batch's other hops' in one
//! `unnest` statement per table. The caller never asks which lane it is in.
//!
//! ```
//! use agentsaga_core::write::{Column, Datum, Kind, Table, Writes};
//! # #[cfg(feature = "sqlite")] // the example runs on an in-memory SQLite database
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), agentsaga_core::Error> {
//! static NOTES: Table = Table::new(
//!     "notes",
//!     &[Column::new("id", Kind::Text), Column::new("body", Kind::Text)],
//!     1,
//! );
//! let store = agentsaga_core::Store::connect("sqlite::memory:").await?;
//! let mut tx = store.begin().await?;
//! agentsaga_core::Sql::new("CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT)")
//!     .execute(tx.conn())
//!     .await?;
//! let mut writes = Writes::new();
//! writes.upsert(&NOTES, vec![Datum::from("n1"), Datum::from("hello")]);
//! writes.upsert(&NOTES, vec![Datum::from("n1"), Datum::from("hello again")]);
//! tx.write(writes).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

use uuid::Uuid;

use crate::{Error, Message, MessageId, Result};

/// A table that hops write, its columns declared once for every driver.
#[derive(Debug)]
pub struct Table {
    pub(crate) name: &'static str,
    pub(crate) columns: &'static [Column],
    /// How many leading columns are the row's key (the conflict target of an upsert).
    pub(crate) key: usize,
    /// Statements a driver renders once for this table (PostgreSQL's set statements:
    /// insert, upsert).
    #[allow(dead_code, reason = "for a driver that renders statements per table")]
    pub(crate) rendered: [std::sync::OnceLock<String>; 2],
    /// `INSERT INTO name (columns) ` and the upsert's conflict clause, rendered once.
    head: std::sync::OnceLock<String>,
    conflict: std::sync::OnceLock<String>,
}

impl Table {
    /// The table `name` with `columns`, the first `key` of which identify a row.
    pub const fn new(name: &'static str, columns: &'static [Column], key: usize) -> Self {
        Self {
            name,
            columns,
            key,
            rendered: [std::sync::OnceLock::new(), std::sync::OnceLock::new()],
            head: std::sync::OnceLock::new(),
            conflict: std::sync::OnceLock::new(),
        }
    }

    /// The table's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The column names, in order, separated by `, `.
    pub(crate) fn column_list(&self) -> String {
        let names: Vec<&str> = self.columns.iter().map(|c| c.name).collect();
        names.join(", ")
    }

    /// `INSERT INTO name (columns) `, the head of every insert of the table.
    pub(crate) fn insert_head(&self) -> &str {
        self.head
            .get_or_init(|| format!("INSERT INTO {} ({}) ", self.name, self.column_list()))
    }

    /// What an upsert does on a conflict with a stored row (` ON CONFLICT …`).
    pub(crate) fn on_conflict(&self) -> &str {
        self.conflict.get_or_init(|| self.render_on_conflict())
    }

    fn render_on_conflict(&self) -> String {
        let key: Vec<&str> = self.columns[..self.key].iter().map(|c| c.name).collect();
        let sets: Vec<String> = self.columns[self.key..]
            .iter()
            .filter_map(|c| match c.conflict {
                OnConflict::Keep => None,
                OnConflict::Update => Some(format!("{0} = excluded.{0}", c.name)),
                OnConflict::KeepFirst => Some(format!(
                    "{0} = COALESCE({1}.{0}, excluded.{0})",
                    c.name, self.name
                )),
            })
            .collect();
        if sets.is_empty() {
            return format!(" ON CONFLICT ({}) DO NOTHING", key.join(", "));
        }
        format!(
            " ON CONFLICT ({}) DO UPDATE SET {}",
            key.join(", "),
            sets.join(", ")
        )
    }
}

/// One column of a [`Table`].
#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) conflict: OnConflict,
}

impl Column {
    /// A column; an upsert overwrites it.
    pub const fn new(name: &'static str, kind: Kind) -> Self {
        Self {
            name,
            kind,
            conflict: OnConflict::Update,
        }
    }

    /// An upsert leaves it as stored (a creation time, a column set once).
    #[must_use]
    pub const fn kept(mut self) -> Self {
        self.conflict = OnConflict::Keep;
        self
    }

    /// An upsert sets it only if it is `NULL` (the first value written stays).
    #[must_use]
    pub const fn first(mut self) -> Self {
        self.conflict = OnConflict::KeepFirst;
        self
    }
}

/// What an upsert does to a column of a stored row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnConflict {
    Update,
    Keep,
    KeepFirst,
}

/// A column's type, as each driver stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A UUID ([`Datum::Id`]): `uuid` on PostgreSQL, hyphenated text on SQLite.
    Id,
    /// Text.
    Text,
    /// JSON given as text: `jsonb` on PostgreSQL, text on SQLite.
    Json,
    /// A small integer: `int4` on PostgreSQL, `INTEGER` on SQLite.
    Int,
    /// A 64-bit integer.
    BigInt,
    /// A boolean (0 or 1 on SQLite).
    Bool,
    /// A time given in Unix milliseconds ([`Datum::Int`]): `timestamptz` on
    /// PostgreSQL, the milliseconds on SQLite.
    Time,
    /// The moment of the write ([`Datum::Now`]) or `NULL`: the database's `now()` on
    /// PostgreSQL (one clock for every process), the milliseconds given on SQLite
    /// (this process's clock).
    Stamp,
}

/// One value of a row.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Datum {
    /// `NULL`.
    Null,
    /// An integer ([`Kind::Int`], [`Kind::BigInt`], [`Kind::Time`]).
    Int(i64),
    /// Text ([`Kind::Text`], [`Kind::Json`]).
    Text(String),
    /// A boolean ([`Kind::Bool`]).
    Bool(bool),
    /// A UUID ([`Kind::Id`]).
    Id(Uuid),
    /// Now, in Unix milliseconds by the writer's clock ([`Kind::Stamp`]).
    Now(i64),
}

impl From<i64> for Datum {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<i32> for Datum {
    fn from(v: i32) -> Self {
        Self::Int(i64::from(v))
    }
}

impl From<u32> for Datum {
    fn from(v: u32) -> Self {
        Self::Int(i64::from(v))
    }
}

impl From<bool> for Datum {
    fn from(v: bool) -> Self {
        Self::Bool(v)
    }
}

impl From<String> for Datum {
    fn from(v: String) -> Self {
        Self::Text(v)
    }
}

impl From<&str> for Datum {
    fn from(v: &str) -> Self {
        Self::Text(v.to_owned())
    }
}

impl From<Uuid> for Datum {
    fn from(v: Uuid) -> Self {
        Self::Id(v)
    }
}

impl From<MessageId> for Datum {
    fn from(v: MessageId) -> Self {
        Self::Id(*v.as_uuid())
    }
}

impl<T: Into<Datum>> From<Option<T>> for Datum {
    fn from(v: Option<T>) -> Self {
        v.map_or(Self::Null, Into::into)
    }
}

/// A row to write.
#[derive(Debug, Clone)]
pub(crate) struct RowWrite {
    pub(crate) table: &'static Table,
    /// `true`: insert or update ([`Writes::upsert`]); `false`: insert.
    pub(crate) upsert: bool,
    pub(crate) values: Vec<Datum>,
}

/// What a hop writes: rows of [`Table`]s, in order, then messages. Hand it to
/// [`Tx::write`](crate::Tx::write) (or [`Tx::write_last`](crate::Tx::write_last)).
#[derive(Debug, Default, Clone)]
pub struct Writes {
    pub(crate) rows: Vec<RowWrite>,
    pub(crate) messages: Vec<Message>,
}

impl Writes {
    /// Nothing to write yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts a row of `table` (its values in the order of the table's columns); a
    /// row whose key is stored fails the write.
    pub fn insert(&mut self, table: &'static Table, values: Vec<Datum>) -> &mut Self {
        self.rows.push(RowWrite {
            table,
            upsert: false,
            values,
        });
        self
    }

    /// Inserts a row of `table`, or updates the stored row of its key (each column as
    /// the table declares it). Of two rows of one key in the same writes, the later
    /// stands.
    pub fn upsert(&mut self, table: &'static Table, values: Vec<Datum>) -> &mut Self {
        self.rows.push(RowWrite {
            table,
            upsert: true,
            values,
        });
        self
    }

    /// Enqueues `messages` after the rows (as [`Tx::enqueue_batch`](crate::Tx::enqueue_batch) does).
    pub fn enqueue(&mut self, messages: &[Message]) -> &mut Self {
        self.messages.extend_from_slice(messages);
        self
    }

    /// No row and no message.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.messages.is_empty()
    }

    /// Checks every row against its table: its number of values, and each value's
    /// variant against its column's kind.
    pub(crate) fn check(&self) -> Result<()> {
        for row in &self.rows {
            let table = row.table;
            if row.values.len() != table.columns.len() {
                return Err(Error::Corrupt {
                    table: table.name,
                    reason: format!(
                        "a row to write has {} values for {} columns",
                        row.values.len(),
                        table.columns.len()
                    ),
                });
            }
            for (column, value) in table.columns.iter().zip(&row.values) {
                let fits = matches!(
                    (column.kind, value),
                    (_, Datum::Null)
                        | (Kind::Id, Datum::Id(_))
                        | (Kind::Text | Kind::Json, Datum::Text(_))
                        | (Kind::Int | Kind::BigInt | Kind::Time, Datum::Int(_))
                        | (Kind::Bool, Datum::Bool(_))
                        | (Kind::Stamp, Datum::Now(_))
                );
                if !fits {
                    return Err(Error::Corrupt {
                        table: table.name,
                        reason: format!(
                            "column {}: {value:?} is not a {:?}",
                            column.name, column.kind
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}
