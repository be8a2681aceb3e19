//! What hops of PostgreSQL's set lane keep as data ([`Kept`]), and the statements that
//! write it for all the batch's hops: one per table and kind of write ([`set_sql`]),
//! each column bound as one array. The batch writes it in `postgres::tx`, the
//! messages in at most two statements (those handed over directly, written leased;
//! the rest).

// A PostgreSQL-only build has no other connection than PostgreSQL's.
#![allow(irrefutable_let_patterns)]

use std::collections::HashMap;

use uuid::Uuid;

use crate::store::write::{Datum, Kind, Table};
use crate::{Error, Message, Result};

/// One value of a row as PostgreSQL binds it (alone, or in the array of its column).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum SetValue {
    /// `uuid`
    Uuid(Option<Uuid>),
    /// `text`
    Text(Option<String>),
    /// `int4`
    Int(Option<i32>),
    /// `int8`
    BigInt(Option<i64>),
    /// `bool`
    Bool(Option<bool>),
}

impl SetValue {
    /// `datum` of a column of `kind`, as PostgreSQL binds it: a [`Kind::Stamp`] as
    /// whether it is now (`now()`) or `NULL`, a [`Kind::Time`] as its milliseconds.
    pub(crate) fn of(table: &Table, kind: Kind, datum: Datum) -> Result<Self> {
        let int = |v: i64| {
            i32::try_from(v).map_err(|_| Error::Corrupt {
                table: table.name,
                reason: format!("{v} does not fit a 32-bit integer column"),
            })
        };
        Ok(match (kind, datum) {
            (Kind::Id, Datum::Id(u)) => Self::Uuid(Some(u)),
            (Kind::Id, _) => Self::Uuid(None),
            (Kind::Text | Kind::Json, Datum::Text(s)) => Self::Text(Some(s)),
            (Kind::Text | Kind::Json, _) => Self::Text(None),
            (Kind::Int, Datum::Int(v)) => Self::Int(Some(int(v)?)),
            (Kind::Int, _) => Self::Int(None),
            (Kind::BigInt | Kind::Time, Datum::Int(v)) => Self::BigInt(Some(v)),
            (Kind::BigInt | Kind::Time, _) => Self::BigInt(None),
            (Kind::Bool, Datum::Bool(b)) => Self::Bool(Some(b)),
            (Kind::Bool, _) => Self::Bool(None),
            (Kind::Stamp, Datum::Now(_)) => Self::Bool(Some(true)),
            (Kind::Stamp, _) => Self::Bool(Some(false)),
        })
    }

    /// A row of `table` as PostgreSQL binds it.
    pub(crate) fn row(table: &Table, values: Vec<Datum>) -> Result<Vec<Self>> {
        table
            .columns
            .iter()
            .zip(values)
            .map(|(c, d)| Self::of(table, c.kind, d))
            .collect()
    }
}

/// `rows` with a key's last row in the place of its first (the key: the first `key`
/// values; none, every row stands).
pub(crate) fn unique_by_key<T: Clone + Eq + std::hash::Hash>(
    key: usize,
    rows: Vec<Vec<T>>,
) -> Vec<Vec<T>> {
    if key == 0 {
        return rows;
    }
    let mut at: HashMap<Vec<T>, usize> = HashMap::new();
    let mut unique: Vec<Vec<T>> = Vec::with_capacity(rows.len());
    for row in rows {
        let k = row[..key.min(row.len())].to_vec();
        match at.get(&k) {
            Some(&i) => unique[i] = row,
            None => {
                at.insert(k, unique.len());
                unique.push(row);
            }
        }
    }
    unique
}

/// The set statement of `table`: every row's values bound as one array per column,
/// as `unnest` takes them; an upsert's conflict clause if `upsert`.
pub(crate) fn set_sql(table: &'static Table, upsert: bool) -> &'static str {
    table.rendered[usize::from(upsert)].get_or_init(|| {
        let names = table.column_list();
        let exprs: Vec<String> = table
            .columns
            .iter()
            .map(|c| match c.kind {
                Kind::Json => format!("u.{}::jsonb", c.name),
                Kind::Time => format!("to_timestamp(u.{} / 1000.0)", c.name),
                Kind::Stamp => format!("CASE WHEN u.{} THEN now() END", c.name),
                _ => format!("u.{}", c.name),
            })
            .collect();
        let arrays: Vec<String> = table
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let ty = match c.kind {
                    Kind::Id => "uuid",
                    Kind::Text | Kind::Json => "text",
                    Kind::Int => "int4",
                    Kind::BigInt | Kind::Time => "int8",
                    Kind::Bool | Kind::Stamp => "bool",
                };
                format!("${}::{ty}[]", i + 1)
            })
            .collect();
        let mut sql = format!(
            "INSERT INTO {} ({names}) SELECT {} FROM unnest({}) AS u({names})",
            table.name,
            exprs.join(", "),
            arrays.join(", ")
        );
        if upsert {
            sql.push_str(table.on_conflict());
        }
        sql
    })
}

/// One column of a set statement, as the array bound for it.
pub(crate) enum Column {
    Uuid(Vec<Option<Uuid>>),
    Text(Vec<Option<String>>),
    Int(Vec<Option<i32>>),
    BigInt(Vec<Option<i64>>),
    Bool(Vec<Option<bool>>),
}

impl Column {
    pub(crate) fn of(value: &SetValue) -> Self {
        match value {
            SetValue::Uuid(_) => Self::Uuid(Vec::new()),
            SetValue::Text(_) => Self::Text(Vec::new()),
            SetValue::Int(_) => Self::Int(Vec::new()),
            SetValue::BigInt(_) => Self::BigInt(Vec::new()),
            SetValue::Bool(_) => Self::Bool(Vec::new()),
        }
    }

    pub(crate) fn push(&mut self, value: SetValue) -> bool {
        match (self, value) {
            (Self::Uuid(v), SetValue::Uuid(x)) => v.push(x),
            (Self::Text(v), SetValue::Text(x)) => v.push(x),
            (Self::Int(v), SetValue::Int(x)) => v.push(x),
            (Self::BigInt(v), SetValue::BigInt(x)) => v.push(x),
            (Self::Bool(v), SetValue::Bool(x)) => v.push(x),
            _ => return false,
        }
        true
    }
}

/// `messages` as the set lane keeps them: their trace context is the caller's, taken
/// now (the batch writes them later, in the lane's task).
pub(crate) fn stamped(messages: &[Message]) -> Vec<Message> {
    let span = crate::propagation::enqueue_span(messages, false);
    span.in_scope(|| {
        messages
            .iter()
            .map(|m| {
                let mut m = m.clone();
                if let Some(headers) = crate::propagation::outgoing(&m.headers) {
                    m.headers = headers;
                }
                m
            })
            .collect()
    })
}

/// What a hop of the set lane keeps as data, written at the end of its batch.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    pub(crate) rows: Vec<(&'static Table, bool, Vec<SetValue>)>,
    pub(crate) messages: Vec<Message>,
    /// The hop ran a statement of its own.
    pub(crate) dirty: bool,
    /// The caller allowed its next write to be kept ([`Hop::defer_next_write`](crate::Hop::defer_next_write)).
    pub(crate) deferrable: bool,
}

impl Kept {
    pub(crate) fn mark(&self) -> (usize, usize) {
        (self.rows.len(), self.messages.len())
    }

    pub(crate) fn truncate(&mut self, (rows, messages): (usize, usize)) {
        self.rows.truncate(rows);
        self.messages.truncate(messages);
    }

    pub(crate) fn push_row(&mut self, table: &'static Table, upsert: bool, row: Vec<SetValue>) {
        self.rows.push((table, upsert, row));
    }

    pub(crate) fn push_messages(&mut self, messages: Vec<Message>) {
        self.messages.extend(messages);
    }
}
