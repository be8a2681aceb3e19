//! What hops of PostgreSQL's set lane keep as data, and how the batch writes it: one
//! statement per kind of row ([`SetStatement`]) for all the batch's hops, and the
//! messages in at most two (those handed over directly, written leased; the rest).

// A PostgreSQL-only build has no other connection than PostgreSQL's.
#![allow(irrefutable_let_patterns)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use uuid::Uuid;

use super::dialect::MessageRows;
use crate::store::{Conn, Store, Tx};
use crate::{Error, Message, MessageId, Result};

/// A statement that writes many rows at once: each parameter `$n` an array (the
/// `n`th value of every row), as `unnest` takes them. The first `key_columns`
/// values identify a row: of two rows of a batch with the same key, the later is
/// written (the later state of the same row).
#[derive(Debug)]
pub struct SetStatement {
    /// The SQL, one array parameter per column.
    pub sql: &'static str,
    /// How many leading columns are the row's key.
    pub key_columns: usize,
}

/// One value of a [`SetStatement`]'s row. Every row of a statement has the same
/// variants in the same order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SetValue {
    /// `uuid[]`
    Uuid(Option<Uuid>),
    /// `text[]`
    Text(Option<String>),
    /// `int4[]`
    Int(Option<i32>),
    /// `int8[]`
    BigInt(Option<i64>),
    /// `bool[]`
    Bool(Option<bool>),
}

/// One column of a set statement, as the array bound for it.
enum Column {
    Uuid(Vec<Option<Uuid>>),
    Text(Vec<Option<String>>),
    Int(Vec<Option<i32>>),
    BigInt(Vec<Option<i64>>),
    Bool(Vec<Option<bool>>),
}

impl Column {
    fn of(value: &SetValue) -> Self {
        match value {
            SetValue::Uuid(_) => Self::Uuid(Vec::new()),
            SetValue::Text(_) => Self::Text(Vec::new()),
            SetValue::Int(_) => Self::Int(Vec::new()),
            SetValue::BigInt(_) => Self::BigInt(Vec::new()),
            SetValue::Bool(_) => Self::Bool(Vec::new()),
        }
    }

    fn push(&mut self, value: SetValue) -> bool {
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

/// What a hop of the set lane keeps as data, written at the end of its batch.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    rows: Vec<(&'static SetStatement, Vec<SetValue>)>,
    messages: Vec<Message>,
    /// The hop ran a statement of its own.
    pub(crate) dirty: bool,
    /// The caller allowed its next write to be kept ([`Tx::defer_next_write`]).
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

    pub(crate) fn push_row(&mut self, statement: &'static SetStatement, row: Vec<SetValue>) {
        self.rows.push((statement, row));
    }

    pub(crate) fn push_messages(&mut self, messages: Vec<Message>) {
        self.messages.extend(messages);
    }
}

impl Tx {
    /// Writes what the batch's hops kept: each set statement's rows (in the order the
    /// statements first came, a key's last row), then the messages.
    pub(crate) async fn flush_sets(&mut self) -> Result<()> {
        let Some(kept) = self.take_kept() else {
            return Ok(());
        };
        let store = self.store().clone();
        let mut statements: Vec<(&'static SetStatement, Vec<Vec<SetValue>>)> = Vec::new();
        for (statement, row) in kept.rows {
            match statements
                .iter_mut()
                .find(|(s, _)| std::ptr::eq(*s, statement))
            {
                Some((_, rows)) => rows.push(row),
                None => statements.push((statement, vec![row])),
            }
        }
        for (statement, rows) in statements {
            self.write_set(statement, rows).await?;
        }
        if !kept.messages.is_empty() {
            self.write_messages(&store, kept.messages).await?;
        }
        Ok(())
    }

    async fn write_set(
        &mut self,
        statement: &SetStatement,
        rows: Vec<Vec<SetValue>>,
    ) -> Result<()> {
        // A key's last row stands for it, in the place of its first.
        let mut at: HashMap<Vec<SetValue>, usize> = HashMap::new();
        let mut unique: Vec<Vec<SetValue>> = Vec::with_capacity(rows.len());
        for row in rows {
            let key = row[..statement.key_columns.min(row.len())].to_vec();
            match at.get(&key) {
                Some(&i) if statement.key_columns > 0 => unique[i] = row,
                _ => {
                    at.insert(key, unique.len());
                    unique.push(row);
                }
            }
        }
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
        let mut q = sqlx::query(statement.sql);
        for column in columns {
            q = match column {
                Column::Uuid(v) => q.bind(v),
                Column::Text(v) => q.bind(v),
                Column::Int(v) => q.bind(v),
                Column::BigInt(v) => q.bind(v),
                Column::Bool(v) => q.bind(v),
            };
        }
        let Conn::Postgres(c) = self.conn_clean() else {
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
            let Conn::Postgres(c) = self.conn_clean() else {
                return Ok(());
            };
            let rows = sqlx::query(
                "INSERT INTO outbox (id, destination, key, payload, headers,
                                     state, attempts, lease_owner, lease_until)
                 SELECT u.id, u.d, u.k, u.p::jsonb, u.h::jsonb, 'in_flight', 1, $6,
                        clock_timestamp() + $7 * interval '1 millisecond'
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
                self.push_handed(Arc::clone(to), envelope);
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
        let Conn::Postgres(c) = self.conn_clean() else {
            return Ok(());
        };
        rows.insert_pending(c).await?;
        self.mark_enqueued();
        Ok(())
    }
}

impl Tx {
    /// Keeps `row` of `statement`, written with the rows of the batch's other hops in
    /// one statement when the set lane's batch ends (see
    /// [`take_set_deferral`](Self::take_set_deferral)). Later statements of this hop
    /// do not see it.
    ///
    /// # Errors
    /// [`Error::BackendMismatch`](crate::Error::BackendMismatch) outside a hop of the
    /// set lane.
    #[cfg(feature = "postgres")]
    pub fn defer_rows(
        &mut self,
        statement: &'static crate::postgres::kept::SetStatement,
        row: Vec<crate::postgres::kept::SetValue>,
    ) -> Result<()> {
        match &mut self.sets {
            Some(kept) => {
                kept.push_row(statement, row);
                Ok(())
            }
            None => Err(crate::Error::BackendMismatch {
                store: "postgres (set lane)",
                connection: self.backend(),
            }),
        }
    }

    /// This transaction becomes the set lane's: its hops may keep their writes.
    #[cfg(feature = "postgres")]
    pub(crate) fn start_sets(&mut self) {
        self.sets = Some(crate::postgres::kept::Kept::default());
    }

    #[cfg(feature = "postgres")]
    pub(crate) fn kept_mut(&mut self) -> Option<&mut crate::postgres::kept::Kept> {
        self.sets.as_mut()
    }

    #[cfg(feature = "postgres")]
    pub(crate) fn take_kept(&mut self) -> Option<crate::postgres::kept::Kept> {
        self.sets.take()
    }

    /// A row written leased, handed over when this transaction commits.
    #[cfg(feature = "postgres")]
    pub(crate) fn push_handed(
        &mut self,
        to: std::sync::Arc<dyn crate::store::Handover>,
        row: crate::Envelope,
    ) {
        self.handed.push(to, row);
    }

    /// The set lane checked the transaction itself (see `sets.rs`): no probe needed.
    #[cfg(feature = "postgres")]
    pub(crate) fn checked(&mut self) {
        self.unchecked = false;
    }
}
