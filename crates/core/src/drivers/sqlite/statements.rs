//! Statements and rows of SQLite's lane as data: built here (the SQL and its values,
//! bound as sqlx binds them), run either through sqlx ([`Statements::to_sqlx`]) or on
//! the connection directly ([`direct`](super::direct)).

use crate::MessageId;
pub(crate) use crate::store::row::{Row, Value};

/// What [`Statements::push_bind`] takes: converts as sqlx's SQLite driver would bind it.
pub(crate) trait Bind {
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
pub(crate) struct Statements {
    list: Vec<Statement>,
    /// The next push begins a new statement.
    ended: bool,
}

impl Statements {
    /// Statements beginning with `sql`.
    pub(crate) fn new(sql: impl AsRef<str>) -> Self {
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
    pub(crate) fn push(&mut self, sql: impl AsRef<str>) -> &mut Self {
        let sql = sql.as_ref();
        if !sql.is_empty() {
            self.current().sql.push_str(sql);
        }
        self
    }

    /// Appends a parameter (`?`) bound to `value` to the current statement.
    pub(crate) fn push_bind(&mut self, value: impl Bind) -> &mut Self {
        let st = self.current();
        st.marks.push(st.sql.len());
        st.sql.push('?');
        st.binds.push(value.into_value());
        self
    }

    /// Ends the current statement: the next push begins another.
    pub(crate) fn end_statement(&mut self) -> &mut Self {
        self.ended = true;
        self
    }

    /// How many statements there are.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// Pushes values separated by `separator`, like `QueryBuilder::separated`.
    pub(crate) fn separated<'a>(&'a mut self, separator: &'static str) -> Separated<'a> {
        Separated {
            to: self,
            separator,
            first: true,
        }
    }

    /// Pushes `VALUES (…), (…)`, one row per item, like `QueryBuilder::push_values`.
    pub(crate) fn push_values<I, F>(&mut self, items: I, mut row: F) -> &mut Self
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
    pub(crate) fn to_sqlx(&self) -> sqlx::QueryBuilder<sqlx::Sqlite> {
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
pub(crate) struct Separated<'a> {
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
    pub(crate) fn push_bind(&mut self, value: impl Bind) -> &mut Self {
        self.next();
        self.to.push_bind(value);
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

/// A database error of a statement run here, as sqlx reports SQLite's: the extended
/// result code as the code.
#[derive(Debug)]
pub(crate) struct DirectError {
    pub(crate) code: std::ffi::c_int,
    pub(crate) message: String,
}

impl std::fmt::Display for DirectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DirectError {}

impl sqlx::error::DatabaseError for DirectError {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(self.code.to_string().into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        use sqlx::error::ErrorKind;
        match self.code {
            libsqlite3_sys::SQLITE_CONSTRAINT_UNIQUE
            | libsqlite3_sys::SQLITE_CONSTRAINT_PRIMARYKEY => ErrorKind::UniqueViolation,
            libsqlite3_sys::SQLITE_CONSTRAINT_FOREIGNKEY => ErrorKind::ForeignKeyViolation,
            libsqlite3_sys::SQLITE_CONSTRAINT_NOTNULL => ErrorKind::NotNullViolation,
            libsqlite3_sys::SQLITE_CONSTRAINT_CHECK => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}
