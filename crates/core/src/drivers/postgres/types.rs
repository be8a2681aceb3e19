//! PostgreSQL's sqlx types of the crate's values, and the conversions between the
//! store's neutral handles and sqlx's PostgreSQL ones.

use sqlx::PgConnection;
use uuid::Uuid;

use super::Postgres;
use crate::drivers::{ConnOf, ReaderOf};
use crate::store::Integer;
use crate::store::row::{Row, Value};
use crate::{Conn, MessageId, ReadPool, Result};

impl Postgres {
    /// The driver's name, as [`Store::backend`](crate::Store::backend) says it.
    pub(crate) const NAME: &'static str = "postgres";
}

impl<'a> From<&'a mut PgConnection> for Conn<'a> {
    fn from(c: &'a mut PgConnection) -> Self {
        Conn(ConnOf::Postgres(c), &crate::clock::SYSTEM)
    }
}

impl<'a> Conn<'a> {
    /// sqlx's PostgreSQL connection, if this is one: for statements of your own that
    /// [`Sql`](crate::Sql) cannot say.
    #[allow(irrefutable_let_patterns)] // a PostgreSQL-only build has no other
    pub fn into_postgres(self) -> Option<&'a mut PgConnection> {
        if let ConnOf::Postgres(c) = self.0 {
            Some(c)
        } else {
            None
        }
    }
}

impl<'a> ReadPool<'a> {
    /// sqlx's PostgreSQL pool, if this is one.
    #[allow(irrefutable_let_patterns)]
    pub fn postgres(self) -> Option<&'a sqlx::PgPool> {
        if let ReaderOf::Postgres(p) = self.0 {
            Some(p)
        } else {
            None
        }
    }
}

impl sqlx::Type<sqlx::Postgres> for Integer {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <i32 as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for Integer {
    fn decode(
        value: sqlx::postgres::PgValueRef<'r>,
    ) -> std::result::Result<Self, sqlx::error::BoxDynError> {
        <i32 as sqlx::Decode<sqlx::Postgres>>::decode(value).map(|n| Integer(i64::from(n)))
    }
}

// A message id binds and decodes as `uuid`, the column type PostgreSQL stores.

impl sqlx::Type<sqlx::Postgres> for MessageId {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <Uuid as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

impl sqlx::postgres::PgHasArrayType for MessageId {
    fn array_type_info() -> sqlx::postgres::PgTypeInfo {
        <Uuid as sqlx::postgres::PgHasArrayType>::array_type_info()
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for MessageId {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <Uuid as sqlx::Encode<sqlx::Postgres>>::encode_by_ref(&self.0, buf)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for MessageId {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        <Uuid as sqlx::Decode<sqlx::Postgres>>::decode(value).map(Self)
    }
}

impl Row {
    /// A row of sqlx's PostgreSQL driver, column by column: integers and booleans as
    /// integers, UUIDs as hyphenated text, JSON as its text, times as Unix
    /// milliseconds (to the nearest), anything else as text.
    ///
    /// # Errors
    /// A column sqlx cannot read as its type says.
    pub(crate) fn from_postgres(row: &sqlx::postgres::PgRow) -> Result<Self> {
        use sqlx::Row as _;
        Self::decode(row, |i, ty| {
            Ok(match ty {
                "INT2" => Value::Int(i64::from(row.try_get::<i16, _>(i)?)),
                "INT4" => Value::Int(i64::from(row.try_get::<i32, _>(i)?)),
                "INT8" => Value::Int(row.try_get(i)?),
                "BOOL" => Value::Int(i64::from(row.try_get::<bool, _>(i)?)),
                "FLOAT4" => Value::Real(f64::from(row.try_get::<f32, _>(i)?)),
                "FLOAT8" => Value::Real(row.try_get(i)?),
                "BYTEA" => Value::Blob(row.try_get(i)?),
                "UUID" => Value::Text(row.try_get::<Uuid, _>(i)?.hyphenated().to_string()),
                "JSON" | "JSONB" => Value::Text(json_text(row.try_get_raw(i)?, ty)?),
                "TIMESTAMPTZ" | "TIMESTAMP" => Value::Int(millis(row.try_get_raw(i)?)?),
                _ => Value::Text(row.try_get(i)?),
            })
        })
    }
}

/// A `json` or `jsonb` value as its text (binary `jsonb` is a version byte, 1, then
/// the text).
fn json_text(raw: sqlx::postgres::PgValueRef<'_>, ty: &str) -> Result<String> {
    let bytes = raw.as_bytes().map_err(sqlx::Error::Decode)?;
    let bytes = match (raw.format(), ty, bytes) {
        (sqlx::postgres::PgValueFormat::Binary, "JSONB", [1, rest @ ..]) => rest,
        (sqlx::postgres::PgValueFormat::Binary, "JSONB", _) => {
            return Err(sqlx::Error::Decode("a jsonb value of an unknown version".into()).into());
        }
        (_, _, bytes) => bytes,
    };
    Ok(String::from_utf8(bytes.to_vec()).map_err(|e| sqlx::Error::Decode(e.into()))?)
}

/// A `timestamptz` (binary: microseconds since 2000-01-01 UTC) as Unix milliseconds,
/// to the nearest.
fn millis(raw: sqlx::postgres::PgValueRef<'_>) -> Result<i64> {
    const EPOCH_2000_US: i64 = 946_684_800_000_000;
    if raw.format() != sqlx::postgres::PgValueFormat::Binary {
        return Err(sqlx::Error::Decode("a time in text format".into()).into());
    }
    let bytes: [u8; 8] = raw
        .as_bytes()
        .map_err(sqlx::Error::Decode)?
        .try_into()
        .map_err(|_| sqlx::Error::Decode("a time of other than 8 bytes".into()))?;
    let us = i64::from_be_bytes(bytes).saturating_add(EPOCH_2000_US);
    Ok(us.saturating_add(500).div_euclid(1000))
}
