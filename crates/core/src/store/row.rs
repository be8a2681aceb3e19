//! A row read by the store for its caller (a hop's prefetch, a load), the same on
//! every backend: its columns by name, each a [`Value`].

use std::sync::Arc;

use crate::{Error, MessageId, Result};

/// A value bound to a statement or read from a row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// SQL `NULL`.
    Null,
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Real(f64),
    /// Text.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
}

/// A row read by a statement: its columns by name.
#[derive(Debug, Clone)]
pub struct Row {
    pub(crate) columns: Arc<[String]>,
    pub(crate) values: Vec<Value>,
}

impl Row {
    /// The value of column `name`.
    ///
    /// # Errors
    /// `sqlx::Error::ColumnNotFound` if there is no such column.
    pub(crate) fn value(&self, name: &str) -> Result<&Value> {
        self.columns
            .iter()
            .position(|c| c == name)
            .and_then(|i| self.values.get(i))
            .ok_or_else(|| Error::Database(sqlx::Error::ColumnNotFound(name.to_owned())))
    }

    fn mismatch(&self, name: &str, wanted: &str) -> Error {
        let index = self.columns.iter().position(|c| c == name).unwrap_or(0);
        Error::Database(sqlx::Error::ColumnDecode {
            index: name.to_owned(),
            source: format!("column {index} is not {wanted}").into(),
        })
    }

    /// An integer column that may be `NULL`.
    ///
    /// # Errors
    /// No such column, or neither an integer nor `NULL`.
    pub fn opt_int(&self, name: &str) -> Result<Option<i64>> {
        match self.value(name)? {
            Value::Null => Ok(None),
            Value::Int(v) => Ok(Some(*v)),
            _ => Err(self.mismatch(name, "an integer")),
        }
    }

    /// An integer column.
    ///
    /// # Errors
    /// No such column, or not an integer.
    pub fn int(&self, name: &str) -> Result<i64> {
        self.opt_int(name)?
            .ok_or_else(|| self.mismatch(name, "a non-NULL integer"))
    }

    /// A text column that may be `NULL`.
    ///
    /// # Errors
    /// No such column, or neither text nor `NULL`.
    pub fn opt_text(&self, name: &str) -> Result<Option<String>> {
        match self.value(name)? {
            Value::Null => Ok(None),
            Value::Text(v) => Ok(Some(v.clone())),
            _ => Err(self.mismatch(name, "text")),
        }
    }

    /// A text column.
    ///
    /// # Errors
    /// No such column, or not text.
    pub fn text(&self, name: &str) -> Result<String> {
        self.opt_text(name)?
            .ok_or_else(|| self.mismatch(name, "non-NULL text"))
    }

    /// A message id column (hyphenated text) that may be `NULL`.
    ///
    /// # Errors
    /// No such column, or neither an id nor `NULL`.
    pub fn opt_id(&self, name: &str) -> Result<Option<MessageId>> {
        self.opt_text(name)?
            .map(|t| t.parse().map_err(|_| self.mismatch(name, "a message id")))
            .transpose()
    }

    /// A row of sqlx's SQLite driver, column by column.
    ///
    /// # Errors
    /// A column sqlx cannot read as its own type says.
    #[cfg(feature = "sqlite")]
    pub fn from_sqlite(row: &sqlx::sqlite::SqliteRow) -> Result<Self> {
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

    /// A row of sqlx's PostgreSQL driver, column by column: integers and booleans as
    /// integers, UUIDs as hyphenated text, anything else as text (cast JSON and times
    /// in the statement: `data::text`, `extract(epoch …)`).
    ///
    /// # Errors
    /// A column sqlx cannot read as its type says.
    #[cfg(feature = "postgres")]
    pub fn from_postgres(row: &sqlx::postgres::PgRow) -> Result<Self> {
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
                "UUID" => Value::Text(row.try_get::<uuid::Uuid, _>(i)?.hyphenated().to_string()),
                _ => Value::Text(row.try_get(i)?),
            })
        })
    }

    /// `row`, each column not NULL read by `value` (given its index and its type's
    /// name).
    fn decode<R: sqlx::Row>(row: &R, value: impl Fn(usize, &str) -> Result<Value>) -> Result<Self>
    where
        usize: sqlx::ColumnIndex<R>,
    {
        use sqlx::{Column, TypeInfo, ValueRef};
        let columns: Arc<[String]> = row.columns().iter().map(|c| c.name().to_owned()).collect();
        let mut values = Vec::with_capacity(columns.len());
        for i in 0..columns.len() {
            let raw = row.try_get_raw(i)?;
            values.push(if raw.is_null() {
                Value::Null
            } else {
                value(i, raw.type_info().name())?
            });
        }
        Ok(Self { columns, values })
    }
}
