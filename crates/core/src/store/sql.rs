//! Reads and writes of your own, written once for every driver: [`Sql`].
//!
//! A statement's text is the SQL that SQLite and PostgreSQL share, its parameters
//! plain `?`s, one per bound value in order; each value is bound with its type,
//! and the driver renders both: a UUID, JSON or a time as its backend stores them
//! (`uuid`, `jsonb`, `timestamptz` on PostgreSQL; text and Unix milliseconds on
//! SQLite), a `NULL` typed, "now" by the database's clock where it has one. Rows come
//! back as [`Row`]s, read the same on every driver (times as Unix milliseconds, JSON
//! as text). What the shared SQL cannot say is asked by name:
//! [`for_update`](Sql::for_update) (a row lock where the database has row locks;
//! [`for_update_skip_locked`](Sql::for_update_skip_locked) to pass over rows held),
//! `{ms <expression>}` (a time as whole Unix milliseconds, to order or compare by),
//! `{now_ms}` (now, in whole Unix milliseconds, by the clock of
//! [`bind_now`](Sql::bind_now)), `{clock_ms}` (the clock of the database, or of this
//! process, as it runs, in milliseconds with a fraction) and
//! [`Conn::lock`](crate::Conn::lock).
//!
//! ```
//! use agentsaga_core::{Sql, Store};
//! # #[cfg(feature = "sqlite")] // the example runs on an in-memory SQLite database
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), agentsaga_core::Error> {
//! let store = Store::connect("sqlite::memory:").await?;
//! let mut tx = store.begin().await?;
//! Sql::new("CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT)").execute(tx.conn()).await?;
//! Sql::new("INSERT INTO notes (id, body) VALUES (?, ?)")
//!     .bind("n1")
//!     .bind("hello")
//!     .execute(tx.conn())
//!     .await?;
//! tx.commit().await?;
//! let rows = Sql::new("SELECT body FROM notes WHERE id = ?").bind("n1").fetch_all(store.reader()).await?;
//! assert_eq!(rows[0].text("body")?, "hello");
//! # Ok(()) }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

use std::borrow::Cow;

use super::conn::{Conn, ReadPool};
use super::row::Row;
use crate::Result;
use crate::drivers::{ConnOf, ReaderOf, on_conn, on_reader};

/// A statement written once for every driver (see the [module](self)).
#[derive(Debug, Clone)]
#[must_use = "a statement does nothing until it is run"]
pub struct Sql {
    pub(crate) text: Cow<'static, str>,
    pub(crate) binds: Vec<Param>,
    pub(crate) for_update: bool,
    /// With `for_update`: rows another transaction holds are skipped, not waited for.
    pub(crate) skip_locked: bool,
}

/// A value bound to a [`Sql`] statement, with its type.
#[derive(Debug, Clone, PartialEq)]
pub struct Param(pub(crate) P);

/// The types a parameter binds as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    Int,
    Real,
    Text,
    Bool,
    Id,
    Json,
    Time,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum P {
    /// `NULL` of a type (PostgreSQL must know it).
    Null(Ty),
    Int(i64),
    Real(f64),
    Text(String),
    Bool(bool),
    Id(uuid::Uuid),
    /// JSON, as text.
    Json(String),
    /// A time, in Unix milliseconds.
    Time(i64),
    /// Now: the database's clock, or this process's (its milliseconds given).
    Now(i64),
    /// Now less this many milliseconds, by the same clock.
    Ago(i64),
}

/// Where a statement runs: a transaction's connection ([`Conn`]) or the read pool
/// ([`ReadPool`]).
#[derive(Debug)]
pub struct On<'c>(pub(crate) OnOf<'c>, pub(crate) &'c crate::clock::Clock);

#[derive(Debug)]
pub(crate) enum OnOf<'c> {
    Conn(ConnOf<'c>),
    Pool(ReaderOf<'c>),
}

impl<'c> From<Conn<'c>> for On<'c> {
    fn from(c: Conn<'c>) -> Self {
        On(OnOf::Conn(c.0), c.1)
    }
}

impl<'c> From<&'c mut Conn<'_>> for On<'c> {
    fn from(c: &'c mut Conn<'_>) -> Self {
        On(OnOf::Conn(c.0.reborrow()), c.1)
    }
}

impl<'c> From<ReadPool<'c>> for On<'c> {
    fn from(p: ReadPool<'c>) -> Self {
        On(OnOf::Pool(p.0), p.1)
    }
}

/// A value that binds as a type of its own ([`Sql::bind`]): integers, floats,
/// booleans, text, UUIDs and message ids; `None` of one binds its typed `NULL`.
pub trait Bind {
    /// The value, typed.
    fn param(self) -> Param;
    /// The `NULL` of its type.
    fn null() -> Param;
}

macro_rules! bind_as {
    ($t:ty, $ty:ident, $v:ident => $e:expr) => {
        impl Bind for $t {
            fn param(self) -> Param {
                let $v = self;
                Param($e)
            }
            fn null() -> Param {
                Param(P::Null(Ty::$ty))
            }
        }
    };
}

bind_as!(i64, Int, v => P::Int(v));
bind_as!(i32, Int, v => P::Int(i64::from(v)));
bind_as!(u32, Int, v => P::Int(i64::from(v)));
bind_as!(f64, Real, v => P::Real(v));
bind_as!(bool, Bool, v => P::Bool(v));
bind_as!(String, Text, v => P::Text(v));
bind_as!(&str, Text, v => P::Text(v.to_owned()));
bind_as!(&String, Text, v => P::Text(v.clone()));
bind_as!(uuid::Uuid, Id, v => P::Id(v));
bind_as!(crate::MessageId, Id, v => P::Id(*v.as_uuid()));

impl<T: Bind> Bind for Option<T> {
    fn param(self) -> Param {
        self.map_or_else(T::null, Bind::param)
    }
    fn null() -> Param {
        T::null()
    }
}

impl Sql {
    /// A statement of `text`, its parameters `?` (write none inside a string literal).
    pub fn new(text: impl Into<Cow<'static, str>>) -> Self {
        Self {
            text: text.into(),
            binds: Vec::new(),
            for_update: false,
            skip_locked: false,
        }
    }

    /// Binds the next `?`: an integer, a float, a boolean, text, a UUID or message id,
    /// or `None` of one of them (a `NULL` of its kind).
    pub fn bind<T: Bind>(mut self, value: T) -> Self {
        self.binds.push(value.param());
        self
    }

    /// Binds the next `?` as JSON given as text (`None`: `NULL`).
    pub fn bind_json<'a>(mut self, json: impl Into<Option<&'a str>>) -> Self {
        let p = json
            .into()
            .map_or(P::Null(Ty::Json), |j| P::Json(j.to_owned()));
        self.binds.push(Param(p));
        self
    }

    /// Binds the next `?` as a time given in Unix milliseconds (`None`: `NULL`).
    pub fn bind_time(mut self, ms: impl Into<Option<i64>>) -> Self {
        let p = ms.into().map_or(P::Null(Ty::Time), P::Time);
        self.binds.push(Param(p));
        self
    }

    /// Binds the next `?` as now: the database's clock where it has one
    /// (PostgreSQL's `now()`), else `ms` (this process's clock,
    /// the store's [`Clock`](crate::clock::Clock), as [`Datum::Now`](crate::write::Datum::Now)).
    pub fn bind_now(mut self, ms: i64) -> Self {
        self.binds.push(Param(P::Now(ms)));
        self
    }

    /// Binds the next `?` as the moment `ms` milliseconds before now, by the same
    /// clock as [`bind_now`](Self::bind_now).
    pub fn bind_ago(mut self, ms: i64) -> Self {
        self.binds.push(Param(P::Ago(ms)));
        self
    }

    /// Locks the rows it reads until the transaction ends, where the database locks
    /// rows (PostgreSQL's `FOR UPDATE`; SQLite's single writer needs none).
    pub fn for_update(mut self) -> Self {
        self.for_update = true;
        self
    }

    /// As [`for_update`](Self::for_update), but rows another transaction holds
    /// locked are skipped rather than waited for (PostgreSQL's `FOR UPDATE SKIP
    /// LOCKED`): work that another process has in hand is left to it, however long it
    /// holds it (a process frozen mid-transaction).
    pub fn for_update_skip_locked(mut self) -> Self {
        self.for_update = true;
        self.skip_locked = true;
        self
    }

    /// The error of a statement whose `?`s and values do not pair up (nothing run).
    pub(crate) fn unpaired(&self) -> crate::Error {
        crate::Error::Database(sqlx::Error::Protocol(format!(
            "a statement's parameters and its {} values do not pair up: {}",
            self.binds.len(),
            self.text
        )))
    }

    /// Runs it: how many rows it changed.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error.
    pub async fn execute<'c>(&self, on: impl Into<On<'c>>) -> Result<u64> {
        let on = on.into();
        let now = on.1.now_ms();
        match on.0 {
            OnOf::Conn(c) => on_conn!(c, D, c => D::execute_sql(&mut *c, self, now).await),
            OnOf::Pool(p) => on_reader!(p, D, p => D::execute_sql(p, self, now).await),
        }
    }

    /// Runs it: the rows it returned.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) on a database error, or a column
    /// of a type no [`Row`] reads.
    pub async fn fetch_all<'c>(&self, on: impl Into<On<'c>>) -> Result<Vec<Row>> {
        let on = on.into();
        let now = on.1.now_ms();
        match on.0 {
            OnOf::Conn(c) => on_conn!(c, D, c => D::fetch_sql(&mut *c, self, now).await),
            OnOf::Pool(p) => on_reader!(p, D, p => D::fetch_sql(p, self, now).await),
        }
    }

    /// Runs it: the first row it returned, if any.
    ///
    /// # Errors
    /// As [`fetch_all`](Self::fetch_all).
    pub async fn fetch_optional<'c>(&self, on: impl Into<On<'c>>) -> Result<Option<Row>> {
        Ok(self.fetch_all(on).await?.into_iter().next())
    }

    /// Runs it: its one row.
    ///
    /// # Errors
    /// As [`fetch_all`](Self::fetch_all); `sqlx::Error::RowNotFound` for no row.
    pub async fn fetch_one<'c>(&self, on: impl Into<On<'c>>) -> Result<Row> {
        self.fetch_optional(on)
            .await?
            .ok_or(crate::Error::Database(sqlx::Error::RowNotFound))
    }
}

/// The parts of a statement's text, for a driver to render: text, a parameter, or a
/// token (`{ms <expression>}`, `{now_ms}`, `{clock_ms}`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Part<'a> {
    Text(&'a str),
    Param,
    Ms(&'a str),
    NowMs,
    ClockMs,
}

/// Splits `text` into its parts. A `{` that opens no token is text.
pub(crate) fn parts(text: &str) -> Vec<Part<'_>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(['?', '{']) {
        if i > 0 {
            out.push(Part::Text(&rest[..i]));
        }
        let here = &rest[i..];
        if here.starts_with('?') {
            out.push(Part::Param);
            rest = &rest[i + 1..];
        } else if let Some(after) = here.strip_prefix("{clock_ms}") {
            out.push(Part::ClockMs);
            rest = after;
        } else if let Some(after) = here.strip_prefix("{now_ms}") {
            out.push(Part::NowMs);
            rest = after;
        } else if let Some((expr, after)) = here
            .strip_prefix("{ms ")
            .and_then(|t| t.split_once('}'))
            .filter(|(expr, _)| !expr.contains(['?', '{']))
        {
            out.push(Part::Ms(expr));
            rest = after;
        } else {
            out.push(Part::Text("{"));
            rest = &rest[i + 1..];
        }
    }
    if !rest.is_empty() {
        out.push(Part::Text(rest));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Part, parts};

    #[test]
    fn parts_of_a_statement() {
        assert_eq!(
            parts("SELECT {ms t} AS t FROM x WHERE a = ? AND b < {clock_ms} AND j = '{}'"),
            vec![
                Part::Text("SELECT "),
                Part::Ms("t"),
                Part::Text(" AS t FROM x WHERE a = "),
                Part::Param,
                Part::Text(" AND b < "),
                Part::ClockMs,
                Part::Text(" AND j = '"),
                Part::Text("{"),
                Part::Text("}'"),
            ]
        );
        // A `{` that opens no token keeps the `?`s after it.
        assert_eq!(
            parts("SET j = '{' || ? || '}' WHERE id = ?"),
            vec![
                Part::Text("SET j = '"),
                Part::Text("{"),
                Part::Text("' || "),
                Part::Param,
                Part::Text(" || '}' WHERE id = "),
                Part::Param,
            ]
        );
    }
}
