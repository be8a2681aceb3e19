//! Statements and rows of SQLite's lane as data: built here (the SQL and its values,
//! bound as sqlx binds them), run either through sqlx ([`Statements::to_sqlx`]) or on
//! the connection directly ([`direct`](super::direct)).

use std::sync::Arc;

use crate::{Error, MessageId, Result};

/// A value bound to a statement or read from a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
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

/// What [`Statements::push_bind`] takes: converts as sqlx's SQLite driver would bind it.
pub trait Bind {
    /// The value bound.
    fn into_value(self) -> Value;
}

impl Bind for Value {
    fn into_value(self) -> Value {
        self
    }
}

impl Bind for i64 {
    fn into_value(self) -> Value {
        Value::Int(self)
    }
}

impl Bind for i32 {
    fn into_value(self) -> Value {
        Value::Int(i64::from(self))
    }
}

impl Bind for bool {
    fn into_value(self) -> Value {
        Value::Int(i64::from(self))
    }
}

impl Bind for f64 {
    fn into_value(self) -> Value {
        Value::Real(self)
    }
}

impl Bind for String {
    fn into_value(self) -> Value {
        Value::Text(self)
    }
}

impl Bind for &String {
    fn into_value(self) -> Value {
        Value::Text(self.clone())
    }
}

impl Bind for &str {
    fn into_value(self) -> Value {
        Value::Text(self.to_owned())
    }
}

impl Bind for Vec<u8> {
    fn into_value(self) -> Value {
        Value::Blob(self)
    }
}

impl Bind for MessageId {
    fn into_value(self) -> Value {
        Value::Text(self.to_string())
    }
}

impl<T: Bind> Bind for Option<T> {
    fn into_value(self) -> Value {
        self.map_or(Value::Null, Bind::into_value)
    }
}

/// One statement: its SQL (parameters `?`) and its values.
#[derive(Debug, Clone, Default)]
pub(crate) struct Statement {
    pub(crate) sql: String,
    /// Where each `?` of a bound value is in `sql`.
    marks: Vec<usize>,
    pub(crate) binds: Vec<Value>,
}

impl Statement {
    /// A statement without parameters.
    pub(crate) fn plain(sql: &str) -> Self {
        Self {
            sql: sql.to_owned(),
            ..Self::default()
        }
    }

    /// `sql` with numbered parameters (`?1`, `?2`, … each once, in order) bound to
    /// `binds`. Run on a session only (not turned into a sqlx query).
    pub(crate) fn numbered(sql: &str, binds: Vec<Value>) -> Self {
        Self {
            sql: sql.to_owned(),
            marks: Vec::new(),
            binds,
        }
    }

    /// `sql` (parameters `?`, none inside a string literal) with `binds` in order.
    pub(crate) fn with(sql: &str, binds: impl IntoIterator<Item = Value>) -> Self {
        let marks = sql.match_indices('?').map(|(i, _)| i).collect();
        Self {
            sql: sql.to_owned(),
            marks,
            binds: binds.into_iter().collect(),
        }
    }
}

/// Statements to run in order, built like `sqlx::QueryBuilder`: each with its own
/// SQL and values. On SQLite's lane they run on the connection directly; elsewhere as
/// one sqlx query of several statements.
#[derive(Debug, Clone, Default)]
pub struct Statements {
    list: Vec<Statement>,
    /// The next push begins a new statement.
    ended: bool,
}

impl Statements {
    /// Statements beginning with `sql`.
    pub fn new(sql: impl AsRef<str>) -> Self {
        let mut s = Self::default();
        s.push(sql);
        s
    }

    fn current(&mut self) -> &mut Statement {
        if self.ended || self.list.is_empty() {
            self.list.push(Statement::default());
            self.ended = false;
        }
        let last = self.list.len() - 1;
        &mut self.list[last]
    }

    /// Appends SQL to the current statement.
    pub fn push(&mut self, sql: impl AsRef<str>) -> &mut Self {
        let sql = sql.as_ref();
        if !sql.is_empty() {
            self.current().sql.push_str(sql);
        }
        self
    }

    /// Appends a parameter (`?`) bound to `value` to the current statement.
    pub fn push_bind(&mut self, value: impl Bind) -> &mut Self {
        let st = self.current();
        st.marks.push(st.sql.len());
        st.sql.push('?');
        st.binds.push(value.into_value());
        self
    }

    /// Ends the current statement: the next push begins another.
    pub fn end_statement(&mut self) -> &mut Self {
        self.ended = true;
        self
    }

    /// How many statements there are.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// No statement at all.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Appends `other`'s statements after these.
    pub fn append(&mut self, other: Statements) {
        self.list.extend(other.list);
        self.ended = true;
    }

    /// Pushes values separated by `separator`, like `QueryBuilder::separated`.
    pub fn separated<'a>(&'a mut self, separator: &'static str) -> Separated<'a> {
        Separated {
            to: self,
            separator,
            first: true,
        }
    }

    /// Pushes `VALUES (…), (…)`, one row per item, like `QueryBuilder::push_values`.
    pub fn push_values<I, F>(&mut self, items: I, mut row: F) -> &mut Self
    where
        I: IntoIterator,
        F: FnMut(Separated<'_>, I::Item),
    {
        self.push("VALUES ");
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                self.push(", ");
            }
            self.push("(");
            row(self.separated(", "), item);
            self.push(")");
        }
        self
    }

    pub(crate) fn statements(&self) -> &[Statement] {
        &self.list
    }

    /// All statements as one sqlx query (SQLite runs several statements in one query;
    /// parameters are `?`, bound in order).
    pub fn to_sqlx(&self) -> sqlx::QueryBuilder<sqlx::Sqlite> {
        let mut q = sqlx::QueryBuilder::new("");
        for (i, st) in self.list.iter().enumerate() {
            if i > 0 {
                q.push(";\n");
            }
            let mut from = 0;
            for (mark, value) in st.marks.iter().zip(&st.binds) {
                q.push(&st.sql[from..*mark]);
                q.push_bind(value.clone());
                from = mark + 1;
            }
            q.push(&st.sql[from..]);
        }
        q
    }
}

/// Pushes separated by a separator; see [`Statements::separated`].
#[derive(Debug)]
pub struct Separated<'a> {
    to: &'a mut Statements,
    separator: &'static str,
    first: bool,
}

impl Separated<'_> {
    fn next(&mut self) {
        if !self.first {
            self.to.push(self.separator);
        }
        self.first = false;
    }

    /// The separator (but before the first), then a parameter bound to `value`.
    pub fn push_bind(&mut self, value: impl Bind) -> &mut Self {
        self.next();
        self.to.push_bind(value);
        self
    }

    /// The separator (but before the first), then `sql`.
    pub fn push(&mut self, sql: impl AsRef<str>) -> &mut Self {
        self.next();
        self.to.push(sql);
        self
    }

    /// A parameter bound to `value`, without a separator.
    pub fn push_bind_unseparated(&mut self, value: impl Bind) -> &mut Self {
        self.to.push_bind(value);
        self
    }

    /// `sql`, without a separator.
    pub fn push_unseparated(&mut self, sql: impl AsRef<str>) -> &mut Self {
        self.to.push(sql);
        self
    }
}

impl sqlx::Type<sqlx::Sqlite> for Value {
    fn type_info() -> sqlx::sqlite::SqliteTypeInfo {
        <String as sqlx::Type<sqlx::Sqlite>>::type_info()
    }

    fn compatible(_: &sqlx::sqlite::SqliteTypeInfo) -> bool {
        true
    }
}

impl<'q> sqlx::Encode<'q, sqlx::Sqlite> for Value {
    fn encode_by_ref(
        &self,
        buf: &mut <sqlx::Sqlite as sqlx::Database>::ArgumentBuffer,
    ) -> std::result::Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        match self {
            Value::Null => Ok(sqlx::encode::IsNull::Yes),
            Value::Int(v) => <i64 as sqlx::Encode<'q, sqlx::Sqlite>>::encode_by_ref(v, buf),
            Value::Real(v) => <f64 as sqlx::Encode<'q, sqlx::Sqlite>>::encode_by_ref(v, buf),
            Value::Text(v) => <String as sqlx::Encode<'q, sqlx::Sqlite>>::encode_by_ref(v, buf),
            Value::Blob(v) => <Vec<u8> as sqlx::Encode<'q, sqlx::Sqlite>>::encode_by_ref(v, buf),
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
    pub fn value(&self, name: &str) -> Result<&Value> {
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
    pub fn from_sqlx(row: &sqlx::sqlite::SqliteRow) -> Result<Self> {
        use sqlx::{Column, Row as _, TypeInfo, ValueRef};
        let columns: Arc<[String]> = row.columns().iter().map(|c| c.name().to_owned()).collect();
        let mut values = Vec::with_capacity(columns.len());
        for i in 0..columns.len() {
            let raw = row.try_get_raw(i)?;
            let value = if raw.is_null() {
                Value::Null
            } else {
                match raw.type_info().name() {
                    "INTEGER" | "BOOLEAN" => Value::Int(row.try_get(i)?),
                    "REAL" => Value::Real(row.try_get(i)?),
                    "BLOB" => Value::Blob(row.try_get(i)?),
                    _ => Value::Text(row.try_get(i)?),
                }
            };
            values.push(value);
        }
        Ok(Self { columns, values })
    }
}
