//! PostgreSQL's rendering of a [`Sql`] statement: each `?` becomes a numbered
//! parameter cast to its type (so that a `NULL` has one), a UUID binds as `uuid`, JSON
//! as `jsonb`, a time as `timestamptz`, "now" as the database's `now()` (one clock for
//! every process), a row lock as `FOR UPDATE`.

use std::fmt::Write as _;

use sqlx::postgres::PgArguments;
use sqlx::{Arguments, Executor};

use super::Postgres;
use crate::Result;
use crate::store::row::Row;
use crate::store::sql::{P, Part, Sql, Ty, parts};

/// `sql`'s text and arguments, as PostgreSQL takes them.
fn render(sql: &Sql, _now_ms: i64) -> Result<(String, PgArguments)> {
    let mut text = String::with_capacity(sql.text.len() + 16 * sql.binds.len());
    let mut args = PgArguments::default();
    let mut binds = sql.binds.iter();
    let mut n = 0;
    let mut next = |text: &mut String, cast: &str| {
        n += 1;
        let _ = write!(text, "${n}::{cast}");
    };
    for part in parts(&sql.text) {
        match part {
            Part::Text(t) => text.push_str(t),
            Part::Ms(e) => {
                let _ = write!(text, "floor(extract(epoch FROM ({e})) * 1000)::int8");
            }
            Part::NowMs => text.push_str("floor(extract(epoch FROM now()) * 1000)::int8"),
            Part::ClockMs => {
                text.push_str("(extract(epoch FROM clock_timestamp()) * 1000)::float8");
            }
            Part::Param => {
                let Some(p) = binds.next() else {
                    return Err(sql.unpaired());
                };
                let added = match &p.0 {
                    // A NULL binds as its type's Rust type: sqlx prepares a statement
                    // once, with the types of its first values, and a text NULL there
                    // would make a later UUID be read as text.
                    P::Null(Ty::Time) => {
                        text.push_str("to_timestamp(");
                        next(&mut text, "int8");
                        text.push_str(" / 1000.0)");
                        args.add(None::<i64>)
                    }
                    P::Null(ty) => {
                        let (cast, added) = match ty {
                            Ty::Int | Ty::Time => ("int8", args.add(None::<i64>)),
                            Ty::Real => ("float8", args.add(None::<f64>)),
                            Ty::Text => ("text", args.add(None::<String>)),
                            Ty::Bool => ("bool", args.add(None::<bool>)),
                            Ty::Id => ("uuid", args.add(None::<uuid::Uuid>)),
                            Ty::Json => ("jsonb", args.add(None::<String>)),
                        };
                        next(&mut text, cast);
                        added
                    }
                    P::Int(v) => {
                        next(&mut text, "int8");
                        args.add(*v)
                    }
                    P::Real(v) => {
                        next(&mut text, "float8");
                        args.add(*v)
                    }
                    P::Text(v) => {
                        next(&mut text, "text");
                        args.add(v.clone())
                    }
                    P::Json(v) => {
                        next(&mut text, "jsonb");
                        args.add(v.clone())
                    }
                    P::Bool(v) => {
                        next(&mut text, "bool");
                        args.add(*v)
                    }
                    P::Id(v) => {
                        next(&mut text, "uuid");
                        args.add(*v)
                    }
                    P::Time(v) => {
                        text.push_str("to_timestamp(");
                        next(&mut text, "int8");
                        text.push_str(" / 1000.0)");
                        args.add(*v)
                    }
                    P::Now(_) => {
                        text.push_str("now()");
                        continue;
                    }
                    P::Ago(ms) => {
                        text.push_str("(now() - ");
                        next(&mut text, "int8");
                        text.push_str(" * interval '1 millisecond')");
                        args.add(*ms)
                    }
                };
                added.map_err(sqlx::Error::Encode)?;
            }
        }
    }
    if binds.next().is_some() {
        return Err(sql.unpaired());
    }
    if sql.for_update {
        text.push_str(if sql.skip_locked {
            " FOR UPDATE SKIP LOCKED"
        } else {
            " FOR UPDATE"
        });
    }
    Ok((text, args))
}

impl Postgres {
    /// Runs `sql`: the rows it changed.
    pub(crate) async fn execute_sql<'e, E>(on: E, sql: &Sql, now_ms: i64) -> Result<u64>
    where
        E: Executor<'e, Database = sqlx::Postgres>,
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
        E: Executor<'e, Database = sqlx::Postgres>,
    {
        let (text, args) = render(sql, now_ms)?;
        let rows = sqlx::query_with(sqlx::AssertSqlSafe(text), args)
            .fetch_all(on)
            .await?;
        rows.iter().map(Row::from_postgres).collect()
    }
}

impl Postgres {
    /// `load`'s statements, rendered once: on one key (`$1`), the parent locked, then
    /// its children in order; on the set lane's keys (`$1`, a `uuid[]`), the parents
    /// locked in key order, then their children, each row with its key in
    /// `prefetch_key`.
    pub(crate) fn load_sql(load: &'static crate::read::Load, set: bool) -> [&'static str; 2] {
        let (fk, order) = load.child_key();
        let key = load.key();
        let parent = load.parent_columns.join(", ");
        if set {
            let child: Vec<String> = load
                .child_columns
                .iter()
                .map(|c| format!("s.{c}"))
                .collect();
            [
                load.rendered[3].get_or_init(|| {
                    format!(
                        "SELECT {key} AS prefetch_key, {parent} FROM {} \
                         WHERE {key} = ANY($1) ORDER BY {key} FOR UPDATE",
                        load.parent.name
                    )
                }),
                // One index lookup per key, whatever the statistics say (a fresh
                // table's made the planner scan the whole table for `= ANY($1)`).
                load.rendered[4].get_or_init(|| {
                    format!(
                        "SELECT k.id AS prefetch_key, {} FROM unnest($1::uuid[]) AS k(id) \
                         CROSS JOIN LATERAL (SELECT * FROM {} WHERE {fk} = k.id ORDER BY {order}) AS s",
                        child.join(", "),
                        load.child.name
                    )
                }),
            ]
        } else {
            [
                load.rendered[1].get_or_init(|| {
                    format!(
                        "SELECT {parent} FROM {} WHERE {key} = $1 FOR UPDATE",
                        load.parent.name
                    )
                }),
                load.rendered[2].get_or_init(|| {
                    format!(
                        "SELECT {} FROM {} WHERE {fk} = $1 ORDER BY {order}",
                        load.child_columns.join(", "),
                        load.child.name
                    )
                }),
            ]
        }
    }

    // Two statements, on purpose: the first locks the row (waiting for a transaction
    // that holds it), the second reads the children with a snapshot taken after that
    // wait. One statement joining both would read the children as of its start, so a
    // reply handled while another reply of the same saga was being committed would
    // miss that one's step update.
    /// Reads `load` of `key` in `c`'s transaction, the parent row locked.
    pub(crate) async fn load(
        c: &mut sqlx::PgConnection,
        load: &'static crate::read::Load,
        key: uuid::Uuid,
    ) -> Result<Option<crate::read::Loaded>> {
        let [parent, children] = Self::load_sql(load, false);
        let Some(row) = sqlx::query(parent)
            .bind(key)
            .fetch_optional(&mut *c)
            .await?
        else {
            return Ok(None);
        };
        let parent = Row::from_postgres(&row)?;
        let children = sqlx::query(children)
            .bind(key)
            .fetch_all(&mut *c)
            .await?
            .iter()
            .map(Row::from_postgres)
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(crate::read::Loaded { parent, children }))
    }
}

impl Postgres {
    /// Takes the lock `name` until the transaction ends (a transaction advisory lock
    /// on its hash): two transactions that take it take turns.
    pub(crate) async fn lock(c: &mut sqlx::PgConnection, name: &str) -> Result<()> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(name)
            .execute(c)
            .await?;
        Ok(())
    }
}

/// Looks at the PostgreSQL database of `url` (in its search path) on one plain
/// connection: its `outbox` table, its migrations (see
/// [`migrate::probe`](crate::migrate::probe)). A plain connection gives a clear error
/// where a pool would only say "timed out".
pub(crate) async fn probe(
    url: &str,
    timeout: std::time::Duration,
) -> Result<Option<crate::migrate::Probe>> {
    use sqlx::Connection as _;
    use std::str::FromStr as _;
    let Ok(options) = sqlx::postgres::PgConnectOptions::from_str(url) else {
        return Ok(None); // the store reports the malformed URL
    };
    let connect = sqlx::PgConnection::connect_with(&options);
    let mut conn = match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(source)) => {
            return Err(crate::Error::Connect {
                scheme: "postgres",
                source,
            });
        }
        Err(_) => {
            return Err(crate::Error::Connect {
                scheme: "postgres",
                source: sqlx::Error::Protocol(format!("no answer within {}s", timeout.as_secs())),
            });
        }
    };
    let has_outbox: bool = sqlx::query_scalar("SELECT to_regclass('outbox') IS NOT NULL")
        .fetch_one(&mut conn)
        .await?;
    let applied = super::applied(&mut conn).await?;
    let _ = conn.close().await;
    Ok(Some(crate::migrate::Probe {
        has_outbox,
        applied,
    }))
}
