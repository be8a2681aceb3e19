//! SQLite's sqlx types of the crate's values, and the conversions between the store's
//! neutral handles and sqlx's SQLite ones.

use sqlx::SqliteConnection;
use uuid::Uuid;

use super::Sqlite;
use crate::drivers::{ConnOf, ReaderOf};
use crate::store::Integer;
use crate::store::row::{Row, Value};
use crate::{Conn, MessageId, ReadPool, Result};

impl Sqlite {
    /// The driver's name, as [`Store::backend`](crate::Store::backend) says it.
    pub(crate) const NAME: &'static str = "sqlite";
}

impl<'a> From<&'a mut SqliteConnection> for Conn<'a> {
    fn from(c: &'a mut SqliteConnection) -> Self {
        Conn(ConnOf::Sqlite(c), &crate::clock::SYSTEM)
    }
}

impl<'a> Conn<'a> {
    /// sqlx's SQLite connection, if this is one: for statements of your own that
    /// [`Sql`](crate::Sql) cannot say.
    #[allow(irrefutable_let_patterns)] // a SQLite-only build has no other
    pub fn into_sqlite(self) -> Option<&'a mut SqliteConnection> {
        if let ConnOf::Sqlite(c) = self.0 {
            Some(c)
        } else {
            None
        }
    }
}

impl<'a> ReadPool<'a> {
    /// sqlx's SQLite pool, if this is one.
    #[allow(irrefutable_let_patterns)]
    pub fn sqlite(self) -> Option<&'a sqlx::SqlitePool> {
        if let ReaderOf::Sqlite(p) = self.0 {
            Some(p)
        } else {
            None
        }
    }
}

impl sqlx::Type<sqlx::Sqlite> for Integer {
    fn type_info() -> sqlx::sqlite::SqliteTypeInfo {
        <i64 as sqlx::Type<sqlx::Sqlite>>::type_info()
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Sqlite> for Integer {
    fn decode(
        value: sqlx::sqlite::SqliteValueRef<'r>,
    ) -> std::result::Result<Self, sqlx::error::BoxDynError> {
        <i64 as sqlx::Decode<sqlx::Sqlite>>::decode(value).map(Integer)
    }
}

// A message id binds and decodes as hyphenated text, the column type SQLite stores.

impl sqlx::Type<sqlx::Sqlite> for MessageId {
    fn type_info() -> sqlx::sqlite::SqliteTypeInfo {
        <uuid::fmt::Hyphenated as sqlx::Type<sqlx::Sqlite>>::type_info()
    }

    fn compatible(ty: &sqlx::sqlite::SqliteTypeInfo) -> bool {
        <String as sqlx::Type<sqlx::Sqlite>>::compatible(ty)
    }
}

impl sqlx::Encode<'_, sqlx::Sqlite> for MessageId {
    fn encode_by_ref(
        &self,
        buf: &mut <sqlx::Sqlite as sqlx::Database>::ArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <uuid::fmt::Hyphenated as sqlx::Encode<sqlx::Sqlite>>::encode(self.0.hyphenated(), buf)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Sqlite> for MessageId {
    fn decode(value: sqlx::sqlite::SqliteValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let text = <&str as sqlx::Decode<sqlx::Sqlite>>::decode(value)?;
        Ok(Self(
            Uuid::parse_str(text).map_err(|e| format!("message id `{text}`: {e}"))?,
        ))
    }
}

impl Row {
    /// A row of sqlx's SQLite driver, column by column.
    ///
    /// # Errors
    /// A column sqlx cannot read as its own type says.
    pub(crate) fn from_sqlite(row: &sqlx::sqlite::SqliteRow) -> Result<Self> {
        use sqlx::Row as _;
        Self::decode(row, |i, ty| {
            Ok(match ty {
                "INTEGER" | "BOOLEAN" => Value::Int(row.try_get(i)?),
                "REAL" => Value::Real(row.try_get(i)?),
                "BLOB" => Value::Blob(row.try_get(i)?),
                _ => Value::Text(row.try_get(i)?),
            })
        })
    }
}
