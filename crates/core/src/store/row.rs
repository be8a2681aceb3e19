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

/// Some columns of the rows of one statement, renamed ([`Row::pick`]).
#[derive(Debug)]
pub(crate) struct Pick {
    columns: Arc<[String]>,
    at: Vec<usize>,
}

impl Pick {
    /// The picked columns of `row` (a row of the statement picked from), moved out.
    pub(crate) fn take(&self, row: &mut Row) -> Row {
        let values = self
            .at
            .iter()
            .map(|&i| {
                row.values
                    .get_mut(i)
                    .map_or(Value::Null, |v| std::mem::replace(v, Value::Null))
            })
            .collect();
        Row {
            columns: Arc::clone(&self.columns),
            values,
        }
    }
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

    /// A floating-point column that may be `NULL` (an integer reads as one too).
    ///
    /// # Errors
    /// No such column, or neither a number nor `NULL`.
    pub fn opt_real(&self, name: &str) -> Result<Option<f64>> {
        match self.value(name)? {
            Value::Null => Ok(None),
            Value::Real(v) => Ok(Some(*v)),
            #[allow(clippy::cast_precision_loss)] // as the database would
            Value::Int(v) => Ok(Some(*v as f64)),
            _ => Err(self.mismatch(name, "a number")),
        }
    }

    /// A floating-point column.
    ///
    /// # Errors
    /// No such column, or not a number.
    pub fn real(&self, name: &str) -> Result<f64> {
        self.opt_real(name)?
            .ok_or_else(|| self.mismatch(name, "a non-NULL number"))
    }

    /// A boolean column (an integer: 0 is false) that may be `NULL`.
    ///
    /// # Errors
    /// No such column, or neither an integer nor `NULL`.
    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>> {
        Ok(self.opt_int(name)?.map(|v| v != 0))
    }

    /// A boolean column.
    ///
    /// # Errors
    /// No such column, or not an integer.
    pub fn bool(&self, name: &str) -> Result<bool> {
        Ok(self.int(name)? != 0)
    }

    /// A UUID column (hyphenated text on SQLite, `uuid` on PostgreSQL) that may be
    /// `NULL`.
    ///
    /// # Errors
    /// No such column, or neither a UUID nor `NULL`.
    pub fn opt_uuid(&self, name: &str) -> Result<Option<uuid::Uuid>> {
        self.opt_text(name)?
            .map(|t| t.parse().map_err(|_| self.mismatch(name, "a UUID")))
            .transpose()
    }

    /// A UUID column.
    ///
    /// # Errors
    /// No such column, or not a UUID.
    pub fn uuid(&self, name: &str) -> Result<uuid::Uuid> {
        self.opt_uuid(name)?
            .ok_or_else(|| self.mismatch(name, "a non-NULL UUID"))
    }

    /// Which of its columns `rename` keeps, under the names it gives them: for the
    /// rows of one statement (the same columns), taken with [`Pick::take`], their
    /// names shared.
    pub(crate) fn pick<'a>(&'a self, rename: impl Fn(&'a str) -> Option<&'a str>) -> Pick {
        let mut columns = Vec::new();
        let mut at = Vec::new();
        for (i, c) in self.columns.iter().enumerate() {
            if let Some(name) = rename(c) {
                columns.push(name.to_owned());
                at.push(i);
            }
        }
        Pick {
            columns: columns.into(),
            at,
        }
    }

    /// The value of the column at `i`, if there is one.
    #[allow(dead_code, reason = "for a driver that splits the rows of a join")]
    pub(crate) fn value_at(&self, i: usize) -> Option<&Value> {
        self.values.get(i)
    }

    /// The names of its columns, in order.
    pub fn columns(&self) -> &[String] {
        &self.columns
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

    /// `row`, each column not NULL read by `value` (given its index and its type's
    /// name).
    pub(crate) fn decode<R: sqlx::Row>(
        row: &R,
        value: impl Fn(usize, &str) -> Result<Value>,
    ) -> Result<Self>
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
