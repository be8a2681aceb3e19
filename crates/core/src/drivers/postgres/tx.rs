//! PostgreSQL's side of a [`Tx`]: a hop of the set lane keeps its last write as data
//! ([`Kept`]), and the batch writes what its hops kept, one statement per table.

// A PostgreSQL-only build has no other connection than PostgreSQL's.
#![allow(irrefutable_let_patterns)]

use std::collections::HashSet;
use std::sync::Arc;

use super::dialect::MessageRows;
use super::kept::{Column, Kept, SetValue, set_sql, unique_by_key};
use super::pgtx::PgTx;
use crate::drivers::TxOf;
use crate::store::write::Table;
use crate::store::{Store, Tx};
use crate::{Error, Message, MessageId, Result};

impl PgTx {
    pub(crate) fn of(tx: sqlx::Transaction<'static, sqlx::Postgres>) -> TxOf {
        TxOf::Postgres(Self { tx, sets: None })
    }
}

impl Tx {
    /// PostgreSQL's side of this transaction (`None` for another driver's).
    #[allow(irrefutable_let_patterns)] // a PostgreSQL-only build has no other
    pub(crate) fn pg(&mut self) -> Option<&mut PgTx> {
        if let TxOf::Postgres(t) = &mut self.inner {
            Some(t)
        } else {
            None
        }
    }

    /// Writes what the batch's hops kept: each set statement's rows (in the order the
    /// statements first came, a key's last row), then the messages.
    pub(crate) async fn flush_sets(&mut self) -> Result<()> {
        let Some(kept) = self.take_kept() else {
            return Ok(());
        };
        let store = self.store().clone();
        let mut statements: Vec<(&'static Table, bool, Vec<Vec<SetValue>>)> = Vec::new();
        for (table, upsert, row) in kept.rows {
            match statements
                .iter_mut()
                .find(|(t, u, _)| std::ptr::eq(*t, table) && *u == upsert)
            {
                Some((_, _, rows)) => rows.push(row),
                None => statements.push((table, upsert, vec![row])),
            }
        }
        for (table, upsert, rows) in statements {
            self.write_set(table, upsert, rows).await?;
        }
        if !kept.messages.is_empty() {
            self.write_messages(&store, kept.messages).await?;
        }
        Ok(())
    }

    async fn write_set(
        &mut self,
        table: &'static Table,
        upsert: bool,
        rows: Vec<Vec<SetValue>>,
    ) -> Result<()> {
        let unique = unique_by_key(table.key, rows);
        let Some(first) = unique.first() else {
            return Ok(());
        };
        let mut columns: Vec<Column> = first.iter().map(Column::of).collect();
        for row in unique {
            if row.len() != columns.len() {
                return Err(Error::Corrupt {
                    table: "(a set statement's rows)",
                    reason: format!("a row has {} values, not {}", row.len(), columns.len()),
                });
            }
            for (column, value) in columns.iter_mut().zip(row) {
                if !column.push(value) {
                    return Err(Error::Corrupt {
                        table: "(a set statement's rows)",
                        reason: "a column changes type between rows".into(),
                    });
                }
            }
        }
        let mut q = sqlx::query(set_sql(table, upsert));
        for column in columns {
            q = match column {
                Column::Uuid(v) => q.bind(v),
                Column::Text(v) => q.bind(v),
                Column::Int(v) => q.bind(v),
                Column::BigInt(v) => q.bind(v),
                Column::Bool(v) => q.bind(v),
            };
        }
        let Some(c) = self.conn_clean().into_postgres() else {
            return Ok(());
        };
        q.execute(c).await?;
        Ok(())
    }

    /// The batch's messages (or those of one [`Tx::enqueue_batch`] on PostgreSQL):
    /// those handed over directly written leased in one statement (the first of its
    /// key in the batch, none of its key live), the rest pending in another, in order.
    pub(crate) async fn write_messages(
        &mut self,
        store: &Store,
        messages: Vec<Message>,
    ) -> Result<()> {
        // Every message's headers first: nothing can fail between a handover slot's
        // reservation and its row's fate (handed over, or the slot given back).
        let headers = messages
            .iter()
            .map(Message::headers_json)
            .collect::<Result<Vec<_>>>()?;
        let to = store.handover();
        let mut keys: HashSet<&str> = HashSet::new();
        let mut leased: Vec<usize> = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            let first_of_key = m.key.as_deref().is_none_or(|k| keys.insert(k));
            if first_of_key
                && m.delay.is_zero()
                && to.as_ref().is_some_and(|to| to.reserve(&m.destination))
            {
                leased.push(i);
            }
        }
        let mut written: HashSet<MessageId> = HashSet::new();
        if let Some(to) = &to
            && !leased.is_empty()
        {
            let rows = MessageRows::of(&messages, &headers, leased.iter().copied());
            // Before the statement: its leases begin later (the server's real clock,
            // `pg_catalog.clock_timestamp()`, as it runs: named in full, so that a
            // test's manual clock, which shadows `clock_timestamp()`, leaves it real).
            let leased_at = self.store.clock().lease_now();
            let Some(c) = self.conn_clean().into_postgres() else {
                return Ok(());
            };
            let rows = sqlx::query(
                "INSERT INTO outbox (id, destination, key, payload, headers,
                                     state, attempts, lease_owner, lease_until)
                 SELECT u.id, u.d, u.k, u.p::jsonb, u.h::jsonb, 'in_flight', 1, $6,
                        pg_catalog.clock_timestamp() + $7 * interval '1 millisecond'
                 FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[])
                      WITH ORDINALITY AS u(id, d, k, p, h, ord)
                 WHERE u.k IS NULL OR NOT EXISTS (SELECT 1 FROM outbox
                     WHERE key = u.k AND state IN ('pending', 'in_flight'))
                 ORDER BY u.ord
                 -- its id stored, or a concurrent producer's row of its key in
                 -- flight (unique outbox_key_in_flight): written pending below
                 ON CONFLICT DO NOTHING
                 RETURNING seq, id, destination, key, payload::text AS payload,
                     headers::text AS headers, attempts,
                     (extract(epoch FROM created_at) * 1000)::bigint AS created_at",
            )
            .bind(rows.ids)
            .bind(rows.destinations)
            .bind(rows.keys)
            .bind(rows.payloads)
            .bind(rows.headers)
            .bind(to.owner())
            .bind(crate::clock::millis(to.lease()))
            .fetch_all(c)
            .await;
            let envelopes = rows.map_err(Error::from).and_then(|rows| {
                rows.iter()
                    .map(crate::store::backend::envelope)
                    .collect::<Result<Vec<_>>>()
            });
            let envelopes = match envelopes {
                Ok(envelopes) => envelopes,
                Err(e) => {
                    for &i in &leased {
                        to.cancel(&messages[i].destination);
                    }
                    return Err(e);
                }
            };
            for envelope in envelopes {
                written.insert(envelope.id);
                self.push_handed(Arc::clone(to), envelope, leased_at);
            }
            for &i in &leased {
                if !written.contains(&messages[i].id) {
                    // Its key has a live row (it waits its turn) or its id is stored.
                    to.cancel(&messages[i].destination);
                }
            }
        }
        let pending = (0..messages.len()).filter(|&i| !written.contains(&messages[i].id));
        let rows = MessageRows::of(&messages, &headers, pending);
        if rows.ids.is_empty() {
            return Ok(());
        }
        let Some(c) = self.conn_clean().into_postgres() else {
            return Ok(());
        };
        rows.insert_pending(c).await?;
        self.mark_enqueued();
        Ok(())
    }
}

impl Tx {
    /// In a hop of the set lane after [`defer_next_write`](Self::defer_next_write):
    /// `true`, and the caller then keeps its last write as data ([`Kept`]), written
    /// with the batch's. Elsewhere `false`: write it as usual. Either way the
    /// permission is used up.
    pub(crate) fn take_set_deferral(&mut self) -> bool {
        self.pg()
            .and_then(|t| t.sets.as_mut())
            .is_some_and(|kept| std::mem::take(&mut kept.deferrable))
    }

    /// This transaction becomes the set lane's: its hops may keep their writes.
    pub(crate) fn start_sets(&mut self) {
        if let Some(t) = self.pg() {
            t.sets = Some(Kept::default());
        }
    }

    pub(crate) fn kept_mut(&mut self) -> Option<&mut Kept> {
        self.pg()?.sets.as_mut()
    }

    pub(crate) fn take_kept(&mut self) -> Option<Kept> {
        self.pg()?.sets.take()
    }

    /// A row written leased, handed over when this transaction commits.
    pub(crate) fn push_handed(
        &mut self,
        to: std::sync::Arc<dyn crate::store::Handover>,
        row: crate::Envelope,
        leased_at: crate::clock::Instant,
    ) {
        self.handed.push(to, row, leased_at);
    }

    /// The set lane checked the transaction itself (see `sets.rs`): no probe needed.
    pub(crate) fn checked(&mut self) {
        self.unchecked = false;
    }
}

/// The error of a commit whose probe failed: 25P02 (the transaction was aborted by an
/// earlier statement) is [`Error::RolledBack`]; anything else (the connection lost)
/// is the database's error, nothing written either way.
pub(crate) fn rolled_back(e: sqlx::Error) -> Error {
    match &e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("25P02") => Error::RolledBack,
        _ => Error::Database(e),
    }
}
