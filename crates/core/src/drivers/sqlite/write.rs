//! SQLite's side of writes as data ([`Writes`]): one multi-row `INSERT` per table,
//! run with the messages in one round trip (see [`Tx::enqueue_batch_after`]), for a
//! hop's last write in the round trip that ends the hop.

use super::statements::{Statements, Value};
use crate::Result;
use crate::store::Tx;
use crate::store::write::{Datum, RowWrite, Table, Writes};

/// Largest number of bound values in one statement (SQLite takes 32,766).
const MAX_BINDS: usize = 20_000;

/// Writes `writes` in `tx`: its rows and messages in one round trip, deferred to the
/// round trip that ends the hop if it is the hop's `last` write and the hop allows it.
pub(crate) async fn write(tx: &mut Tx, writes: Writes, last: bool) -> Result<()> {
    if writes.rows.is_empty() {
        if writes.messages.is_empty() {
            return Ok(());
        }
        return tx.enqueue_batch(&writes.messages).await;
    }
    let statements = render(writes.rows);
    tx.statements_then_messages(statements, &writes.messages, last)
        .await
}

/// The statements that write `rows`: per table and kind of write (insert, upsert), in
/// the order they first come, one `INSERT … VALUES` of its rows (more past
/// [`MAX_BINDS`]).
pub(crate) fn render(rows: Vec<RowWrite>) -> Statements {
    let mut groups: Vec<(&'static Table, bool, Vec<Vec<Datum>>)> = Vec::new();
    for r in rows {
        match groups
            .iter_mut()
            .find(|(t, u, _)| std::ptr::eq(*t, r.table) && *u == r.upsert)
        {
            Some((_, _, rows)) => rows.push(r.values),
            None => groups.push((r.table, r.upsert, vec![r.values])),
        }
    }
    let mut q = Statements::default();
    for (table, upsert, rows) in groups {
        let per = (MAX_BINDS / table.columns.len().max(1)).max(1);
        let mut rows = rows.into_iter().peekable();
        while rows.peek().is_some() {
            q.end_statement();
            q.push(table.insert_head());
            q.push_values(rows.by_ref().take(per), |mut b, row| {
                for value in row {
                    b.push_bind(value_of(value));
                }
            });
            if upsert {
                q.push(table.on_conflict());
            }
        }
    }
    q
}

/// A value as SQLite stores it (as sqlx binds it: a UUID as hyphenated text, a
/// boolean as 0 or 1, a moment as its milliseconds).
fn value_of(datum: Datum) -> Value {
    match datum {
        Datum::Null => Value::Null,
        Datum::Int(v) | Datum::Now(v) => Value::Int(v),
        Datum::Text(s) => Value::Text(s),
        Datum::Bool(b) => Value::Int(i64::from(b)),
        Datum::Id(u) => Value::Text(u.hyphenated().to_string()),
    }
}
