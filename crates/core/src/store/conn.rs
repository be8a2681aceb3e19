//! Connections of either backend, and the values read the same on both.

#[cfg(feature = "postgres")]
use sqlx::PgConnection;
#[cfg(feature = "sqlite")]
use sqlx::SqliteConnection;

/// A borrowed connection of either backend, usually the inside of a transaction.
/// `&mut *tx` of a `sqlx::Transaction` converts into it, so the outbox joins the
/// caller's own transaction.
#[derive(Debug)]
pub enum Conn<'a> {
    /// A SQLite connection.
    #[cfg(feature = "sqlite")]
    Sqlite(&'a mut SqliteConnection),
    /// A PostgreSQL connection.
    #[cfg(feature = "postgres")]
    Postgres(&'a mut PgConnection),
}

impl Conn<'_> {
    /// `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        match self {
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(_) => "sqlite",
            #[cfg(feature = "postgres")]
            Conn::Postgres(_) => "postgres",
        }
    }
}

#[cfg(feature = "sqlite")]
impl<'a> From<&'a mut SqliteConnection> for Conn<'a> {
    fn from(c: &'a mut SqliteConnection) -> Self {
        Conn::Sqlite(c)
    }
}

#[cfg(feature = "postgres")]
impl<'a> From<&'a mut PgConnection> for Conn<'a> {
    fn from(c: &'a mut PgConnection) -> Self {
        Conn::Postgres(c)
    }
}

/// An `integer` column of either backend, as an `i64`: SQLite stores 64 bits,
/// PostgreSQL's `integer` 32. For decoding a row the same way on both
/// (`row.try_get::<Integer, _>("attempts")?.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Integer(pub(crate) i64);

#[cfg(feature = "sqlite")]
impl sqlx::Type<sqlx::Sqlite> for Integer {
    fn type_info() -> sqlx::sqlite::SqliteTypeInfo {
        <i64 as sqlx::Type<sqlx::Sqlite>>::type_info()
    }
}

#[cfg(feature = "sqlite")]
impl<'r> sqlx::Decode<'r, sqlx::Sqlite> for Integer {
    fn decode(
        value: sqlx::sqlite::SqliteValueRef<'r>,
    ) -> std::result::Result<Self, sqlx::error::BoxDynError> {
        <i64 as sqlx::Decode<sqlx::Sqlite>>::decode(value).map(Integer)
    }
}

#[cfg(feature = "postgres")]
impl sqlx::Type<sqlx::Postgres> for Integer {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <i32 as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

#[cfg(feature = "postgres")]
impl<'r> sqlx::Decode<'r, sqlx::Postgres> for Integer {
    fn decode(
        value: sqlx::postgres::PgValueRef<'r>,
    ) -> std::result::Result<Self, sqlx::error::BoxDynError> {
        <i32 as sqlx::Decode<sqlx::Postgres>>::decode(value).map(|n| Integer(i64::from(n)))
    }
}

/// What [`Store::receive`](crate::Store::receive) found in the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipt {
    /// First time this consumer sees this message: process it.
    First,
    /// Seen before: skip it, and do not answer it again.
    Duplicate,
}
