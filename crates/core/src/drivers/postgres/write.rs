//! PostgreSQL's side of writes as data ([`Writes`]): kept for the set lane's
//! statements when the hop allows it, else one statement for all the tables.

// A PostgreSQL-only build has no other connection than PostgreSQL's.
#![allow(irrefutable_let_patterns)]

use sqlx::QueryBuilder;

use super::kept::{SetValue, stamped, unique_by_key};
use crate::Result;
use crate::store::Tx;
use crate::store::write::{Kind, Table, Writes};

/// Largest number of bound values in one statement (PostgreSQL takes 65,535).
const MAX_BINDS: usize = 20_000;

/// Writes `writes` in `tx`: kept as data in a hop of the set lane that allowed its
/// `last` write to be; else its rows now, then its messages.
pub(crate) async fn write(tx: &mut Tx, writes: Writes, last: bool) -> Result<()> {
    if last && tx.take_set_deferral() {
        for m in &writes.messages {
            tx.store().validate(m)?;
        }
        let mut rows = Vec::with_capacity(writes.rows.len());
        for r in writes.rows {
            rows.push((r.table, r.upsert, SetValue::row(r.table, r.values)?));
        }
        let messages = stamped(&writes.messages);
        if let Some(kept) = tx.kept_mut() {
            for (table, upsert, row) in rows {
                kept.push_row(table, upsert, row);
            }
            kept.push_messages(messages);
        }
        return Ok(());
    }
    if !writes.rows.is_empty() {
        let r = write_rows(tx, writes.rows).await;
        tx.suspect(r)?;
    }
    if !writes.messages.is_empty() {
        tx.enqueue_batch(&writes.messages).await?;
    }
    Ok(())
}

/// A table's rows of one kind of write (insert or upsert), as PostgreSQL binds them.
type Group = (&'static Table, bool, Vec<Vec<SetValue>>);

/// Writes rows: one statement for all the tables (each table's rows in a
/// data-modifying `WITH` of the last table's `INSERT`, in the order the tables first
/// come: a row's foreign key is checked at the statement's end), or one per table and
/// chunk past [`MAX_BINDS`].
async fn write_rows(tx: &mut Tx, rows: Vec<crate::store::write::RowWrite>) -> Result<()> {
    let mut groups: Vec<Group> = Vec::new();
    for r in rows {
        let row = SetValue::row(r.table, r.values)?;
        match groups
            .iter_mut()
            .find(|(t, u, _)| std::ptr::eq(*t, r.table) && *u == r.upsert)
        {
            Some((_, _, rows)) => rows.push(row),
            None => groups.push((r.table, r.upsert, vec![row])),
        }
    }
    let groups: Vec<Group> = groups
        .into_iter()
        .map(|(t, u, rows)| (t, u, if u { unique_by_key(t.key, rows) } else { rows }))
        .collect();
    let binds: usize = groups
        .iter()
        .map(|(t, _, rows)| t.columns.len() * rows.len())
        .sum();
    let statements: Vec<Vec<Group>> = if binds <= MAX_BINDS {
        vec![groups]
    } else {
        let mut statements = Vec::new();
        for (t, u, rows) in groups {
            let per = (MAX_BINDS / t.columns.len().max(1)).max(1);
            for chunk in rows.chunks(per) {
                statements.push(vec![(t, u, chunk.to_vec())]);
            }
        }
        statements
    };
    for groups in statements {
        let mut q = QueryBuilder::<sqlx::Postgres>::new("");
        let n = groups.len();
        for (i, (table, upsert, rows)) in groups.iter().enumerate() {
            // `WITH w0 AS (…), w1 AS (…) INSERT …`: every table's rows but the last's
            // in a data-modifying `WITH`.
            if i > 0 {
                q.push(")");
                q.push(if i + 1 < n { ", " } else { " " });
            }
            if i + 1 < n {
                if i == 0 {
                    q.push("WITH ");
                }
                q.push(format!("w{i} AS ("));
            }
            q.push(table.insert_head());
            q.push_values(rows, |mut b, row| {
                for (column, value) in table.columns.iter().zip(row) {
                    push_value(&mut b, column.kind, value.clone());
                }
            });
            if *upsert {
                q.push(table.on_conflict());
            }
        }
        let Some(c) = tx.conn_marked().into_postgres() else {
            return Ok(());
        };
        q.build().execute(&mut *c).await?;
    }
    Ok(())
}

/// Binds `value` of a column of `kind`, with its cast or function.
fn push_value(
    b: &mut sqlx::query_builder::Separated<'_, sqlx::Postgres, &'static str>,
    kind: Kind,
    value: SetValue,
) {
    match kind {
        Kind::Time => {
            b.push("to_timestamp(");
            bind(b, value, true);
            b.push_unseparated(" / 1000.0)");
        }
        Kind::Stamp => {
            b.push("CASE WHEN ");
            bind(b, value, true);
            b.push_unseparated(" THEN now() END");
        }
        Kind::Json => {
            bind(b, value, false);
            b.push_unseparated("::jsonb");
        }
        _ => bind(b, value, false),
    }
}

fn bind(
    b: &mut sqlx::query_builder::Separated<'_, sqlx::Postgres, &'static str>,
    value: SetValue,
    unseparated: bool,
) {
    macro_rules! push {
        ($v:expr) => {
            if unseparated {
                b.push_bind_unseparated($v);
            } else {
                b.push_bind($v);
            }
        };
    }
    match value {
        SetValue::Uuid(v) => push!(v),
        SetValue::Text(v) => push!(v),
        SetValue::Int(v) => push!(v),
        SetValue::BigInt(v) => push!(v),
        SetValue::Bool(v) => push!(v),
    }
}
