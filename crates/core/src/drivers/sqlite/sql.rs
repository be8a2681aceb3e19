//! SQLite's rendering of a [`Sql`] statement: parameters stay `?`, a UUID binds as
//! hyphenated text, JSON as text, a time and "now" as Unix milliseconds by this
//! process's clock (SQLite has no other), a row lock as nothing (the single writer
//! serialises writers already).

use sqlx::sqlite::SqliteArguments;
use sqlx::{Arguments, Executor};

use super::Sqlite;
use super::statements::Statement;
use crate::Result;
use crate::store::row::{Row, Value};
use crate::store::sql::{P, Part, Sql, parts};

/// `sql`'s text and values, as SQLite takes them.
fn values(sql: &Sql, now: i64) -> Result<(String, Vec<Value>)> {
    let mut text = String::with_capacity(sql.text.len());
    let mut values = Vec::with_capacity(sql.binds.len());
    let mut binds = sql.binds.iter();
    for part in parts(&sql.text) {
        match part {
            Part::Text(t) => text.push_str(t),
            Part::Ms(e) => {
                text.push('(');
                text.push_str(e);
                text.push(')');
            }
            Part::NowMs => {
                text.push('?');
                values.push(Value::Int(now));
            }
            Part::ClockMs => {
                text.push('?');
                #[allow(clippy::cast_precision_loss)] // milliseconds fit a float's 53 bits
                values.push(Value::Real(now as f64));
            }
            Part::Param => {
                text.push('?');
                let Some(p) = binds.next() else {
                    return Err(sql.unpaired());
                };
                values.push(match &p.0 {
                    P::Null(_) => Value::Null,
                    P::Int(v) | P::Time(v) | P::Now(v) => Value::Int(*v),
                    P::Ago(ms) => Value::Int(now.saturating_sub(*ms)),
                    P::Real(v) => Value::Real(*v),
                    P::Text(v) | P::Json(v) => Value::Text(v.clone()),
                    P::Bool(v) => Value::Int(i64::from(*v)),
                    P::Id(v) => Value::Text(v.hyphenated().to_string()),
                });
            }
        }
    }
    if binds.next().is_some() {
        return Err(sql.unpaired());
    }
    Ok((text, values))
}

/// `sql`'s text and arguments, as sqlx's SQLite driver takes them.
fn render(sql: &Sql, now: i64) -> Result<(String, SqliteArguments)> {
    let (text, values) = values(sql, now)?;
    let mut args = SqliteArguments::default();
    for v in values {
        match v {
            Value::Null => args.add(None::<i64>),
            Value::Int(v) => args.add(v),
            Value::Real(v) => args.add(v),
            Value::Text(v) => args.add(v),
            Value::Blob(v) => args.add(v),
        }
        .map_err(sqlx::Error::Encode)?;
    }
    Ok((text, args))
}

/// `sql` as a statement of the lane's direct session.
pub(crate) fn statement(sql: &Sql, now: i64) -> Result<Statement> {
    let (text, values) = values(sql, now)?;
    Ok(Statement::with(&text, values))
}

impl Sqlite {
    /// Runs `sql`: the rows it changed.
    pub(crate) async fn execute_sql<'e, E>(on: E, sql: &Sql, now_ms: i64) -> Result<u64>
    where
        E: Executor<'e, Database = sqlx::Sqlite>,
    {
        let (text, args) = render(sql, now_ms)?;
        let done = sqlx::query_with(sqlx::AssertSqlSafe(text), args)
            .execute(on)
            .await?;
        Ok(done.rows_affected())
    }

    /// Runs `sql`: its rows.
    pub(crate) async fn fetch_sql<'e, E>(on: E, sql: &Sql, now_ms: i64) -> Result<Vec<Row>>
    where
        E: Executor<'e, Database = sqlx::Sqlite>,
    {
        let (text, args) = render(sql, now_ms)?;
        let rows = sqlx::query_with(sqlx::AssertSqlSafe(text), args)
            .fetch_all(on)
            .await?;
        rows.iter().map(Row::from_sqlite).collect()
    }
}

impl Sqlite {
    /// Splits the rows of the statement that joins the two tables (the parent's
    /// columns named `p.<column>`, one row per child, or one with a `NULL` order for
    /// none) into what was loaded.
    pub(crate) fn split(
        load: &crate::read::Load,
        rows: Vec<Row>,
    ) -> Result<Option<crate::read::Loaded>> {
        let mut rows = rows.into_iter();
        let Some(mut first) = rows.next() else {
            return Ok(None);
        };
        let (_, order) = load.child_key();
        let order = first
            .columns()
            .iter()
            .position(|c| c == order)
            .ok_or_else(|| crate::Error::Database(sqlx::Error::ColumnNotFound(order.into())))?;
        let parent = first.pick(|c| c.strip_prefix("p."));
        let child = first.pick(|c| (!c.starts_with("p.")).then_some(c));
        let mut children = Vec::with_capacity(rows.len() + 1);
        let parent = parent.take(&mut first);
        for mut row in std::iter::once(first).chain(rows) {
            if row.value_at(order) == Some(&crate::store::row::Value::Null) {
                continue; // no children: one row, its child's columns NULL
            }
            children.push(child.take(&mut row));
        }
        Ok(Some(crate::read::Loaded { parent, children }))
    }

    /// `load`'s statement: the parent joined with its children, its parameter the key
    /// (one `?`), rendered once.
    pub(crate) fn load_sql(load: &'static crate::read::Load) -> &'static str {
        load.rendered[0].get_or_init(|| {
            let (fk, order) = load.child_key();
            let mut cols: Vec<String> = load
                .parent_columns
                .iter()
                .map(|c| format!("p.{c} AS \"p.{c}\""))
                .collect();
            cols.extend(load.child_columns.iter().map(|c| format!("c.{c} AS {c}")));
            format!(
                "SELECT {} FROM {} p LEFT JOIN {} c ON c.{fk} = p.{key} \
                 WHERE p.{key} = ? ORDER BY c.{order}",
                cols.join(", "),
                load.parent.name,
                load.child.name,
                key = load.key(),
            )
        })
    }

    /// Reads `load` of `key` through sqlx.
    pub(crate) async fn load(
        c: &mut sqlx::SqliteConnection,
        load: &'static crate::read::Load,
        key: uuid::Uuid,
    ) -> Result<Option<crate::read::Loaded>> {
        let rows = sqlx::query(Self::load_sql(load))
            .bind(key.hyphenated().to_string())
            .fetch_all(c)
            .await?;
        let rows = rows
            .iter()
            .map(Row::from_sqlite)
            .collect::<Result<Vec<_>>>()?;
        Self::split(load, rows)
    }
}

impl Sqlite {
    /// Takes the lock `name` until the transaction ends: nothing to take, the single
    /// writer serialises SQLite's writers already.
    #[allow(clippy::unused_async)] // the same call as other drivers'
    pub(crate) async fn lock(_c: &mut sqlx::SqliteConnection, _name: &str) -> Result<()> {
        Ok(())
    }
}

/// Looks at the SQLite file of `url` read-only: its `outbox` table, its migrations
/// (see [`migrate::probe`](crate::migrate::probe)); a file that does not exist is an
/// error (nothing is created).
pub(crate) async fn probe(url: &str) -> Result<Option<crate::migrate::Probe>> {
    use sqlx::Connection as _;
    use std::str::FromStr as _;
    if super::file_of(url).is_none() {
        return Ok(None);
    }
    let Ok(options) = sqlx::sqlite::SqliteConnectOptions::from_str(url) else {
        return Ok(None); // the store reports the malformed URL
    };
    let options = options.read_only(true).create_if_missing(false);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .map_err(|source| crate::Error::Connect {
            scheme: "sqlite",
            source,
        })?;
    let has_outbox: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'outbox'",
    )
    .fetch_one(&mut conn)
    .await?;
    let has_outbox = has_outbox > 0;
    let applied = super::applied(&mut conn).await?;
    let _ = conn.close().await;
    Ok(Some(crate::migrate::Probe {
        has_outbox,
        applied,
    }))
}
