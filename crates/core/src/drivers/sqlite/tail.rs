//! A hop's deferred last write on SQLite (its *tail*): the caller's statements, then
//! its messages, run in the round trip that ends the hop.

use super::statements::{self, Statements};
use crate::clock::millis;
use crate::{Envelope, Error, Message, Result};

/// A write of the caller's statements and then messages in one round trip (see
/// `Tx::enqueue_batch_after`), run at once or deferred to the round trip that ends the
/// hop: the caller's statements, then each message's (a message to hand over is first
/// written leased, then, in case it could not be, pending: it keeps its place in the
/// order either way).
pub(crate) struct Tail {
    pub(crate) query: Statements,
    /// For each of the last `ours.len()` statements: the message it writes leased.
    ours: Vec<Option<usize>>,
    /// Each message's destination, and whether a handover slot was reserved for it.
    messages: Vec<(String, bool)>,
    to: Option<std::sync::Arc<dyn crate::store::handover::Handover>>,
    /// Its slots were settled (kept for the rows written leased, given back for the
    /// others); otherwise dropping it gives them all back.
    settled: bool,
    /// When its leases' `lease_until` was computed: they count from here.
    leased_at: crate::clock::Instant,
}

/// What a tail wrote: its rows written leased, for `to` to take on commit, and whether
/// any message was written pending.
pub(crate) struct Written {
    pub(crate) handed: Vec<Envelope>,
    pub(crate) to: Option<std::sync::Arc<dyn crate::store::handover::Handover>>,
    pub(crate) pending: bool,
    /// When their leases began.
    pub(crate) leased_at: crate::clock::Instant,
}

impl std::fmt::Debug for Tail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tail")
            .field("statements", &self.query.len())
            .finish_non_exhaustive()
    }
}

impl Tail {
    /// `query` (statements of the caller's), then `messages`, each
    /// with `leased[i]` (a slot reserved with `to`) written leased if it can be.
    /// Validated already. The tail holds the reserved slots from here on: should it
    /// fail to build, dropping it gives them back.
    pub(crate) fn new(
        mut query: Statements,
        messages: &[Message],
        leased: &[bool],
        to: Option<std::sync::Arc<dyn crate::store::handover::Handover>>,
        clock: &crate::clock::Clock,
    ) -> Result<Self> {
        let ((now, lease_now), leased_at) = (clock.now_and_lease_ms(), clock.lease_now());
        let (owner, until) = match &to {
            Some(to) => (
                to.owner().to_owned(),
                lease_now.saturating_add(millis(to.lease())),
            ),
            None => (String::new(), lease_now),
        };
        let mut tail = Self {
            query: Statements::default(),
            ours: Vec::new(),
            messages: messages
                .iter()
                .zip(leased)
                .map(|(m, &l)| (m.destination.clone(), l))
                .collect(),
            to,
            settled: false,
            leased_at,
        };
        let mut ours = Vec::new();
        let next_statement = |query: &mut Statements| {
            query.end_statement();
        };
        for (i, m) in messages.iter().enumerate() {
            let headers = m.headers_json()?;
            if leased[i] {
                next_statement(&mut query);
                query.push(
                    "INSERT INTO outbox (id, destination, key, payload, headers, available_at,
                         created_at, state, attempts, lease_owner, lease_until)
                     SELECT ",
                );
                push_row(&mut query, m, &headers, now, now);
                query.push(", 'in_flight', 1, ");
                query.push_bind(owner.clone());
                query.push(", ");
                query.push_bind(until);
                query.push(" WHERE ");
                query.push_bind(m.key.clone());
                query.push(" IS NULL OR NOT EXISTS (SELECT 1 FROM outbox WHERE key = ");
                query.push_bind(m.key.clone());
                query.push(
                    " AND state IN ('pending', 'in_flight'))
                     ON CONFLICT (id) DO NOTHING
                     RETURNING seq, id, destination, key, payload, headers, attempts, created_at",
                );
                ours.push(Some(i));
            }
            next_statement(&mut query);
            query.push(
                "INSERT INTO outbox (id, destination, key, payload, headers, available_at, created_at)
                 VALUES (",
            );
            push_row(
                &mut query,
                m,
                &headers,
                now.saturating_add(m.delay_ms()),
                now,
            );
            query.push(") ON CONFLICT (id) DO NOTHING");
            ours.push(None);
        }
        tail.query = query;
        tail.ours = ours;
        Ok(tail)
    }

    /// After its statements ran (`rows`, each with its statement's index): the rows
    /// written leased (to hand over to the handover returned, on commit), and whether
    /// any message was written pending (the relay's to claim). The slots of the messages
    /// not written leased are given back.
    pub(crate) fn written(mut self, rows: Vec<(usize, statements::Row)>) -> Result<Written> {
        let first_ours = self.query.len() - self.ours.len();
        let mut written = vec![None; self.messages.len()];
        for (statement, row) in rows {
            if let Some(Some(i)) = statement
                .checked_sub(first_ours)
                .and_then(|k| self.ours.get(k))
            {
                written[*i] = Some(direct_envelope(&row)?);
            }
        }
        self.settled = true;
        let mut handed = Vec::new();
        let mut pending = false;
        for ((destination, leased), row) in self.messages.iter().zip(written) {
            match row {
                Some(row) => handed.push(row),
                None => {
                    if *leased && let Some(to) = &self.to {
                        to.cancel(destination);
                    }
                    pending = true;
                }
            }
        }
        Ok(Written {
            handed,
            to: self.to.clone(),
            pending,
            leased_at: self.leased_at,
        })
    }
}

/// Decodes an outbox row the lane read directly (see [`envelope`] for sqlx's rows).
pub(crate) fn direct_envelope(row: &statements::Row) -> Result<Envelope> {
    let corrupt = |column: &str, e: &dyn std::fmt::Display| Error::Corrupt {
        table: "outbox",
        reason: format!("{column}: {e}"),
    };
    Ok(Envelope {
        seq: row.int("seq")?,
        id: row
            .opt_id("id")
            .and_then(|id| id.ok_or_else(|| corrupt("id", &"NULL")))?,
        destination: row.text("destination")?,
        key: row.opt_text("key")?,
        payload: row.text("payload")?,
        headers: serde_json::from_str(&row.text("headers")?).map_err(|e| corrupt("headers", &e))?,
        attempts: u32::try_from(row.int("attempts")?.max(0)).unwrap_or(u32::MAX),
        created_at_ms: row.int("created_at")?,
    })
}

/// Binds a message's row: id, destination, key, payload, headers, available_at,
/// created_at, separated by commas.
fn push_row(
    query: &mut Statements,
    m: &Message,
    headers: &str,
    available_at: i64,
    created_at: i64,
) {
    query
        .separated(", ")
        .push_bind(m.id)
        .push_bind(m.destination.clone())
        .push_bind(m.key.clone())
        .push_bind(m.payload.clone())
        .push_bind(headers.to_owned())
        .push_bind(available_at)
        .push_bind(created_at);
}

impl Drop for Tail {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Some(to) = &self.to {
            for (destination, leased) in &self.messages {
                if *leased {
                    to.cancel(destination);
                }
            }
        }
    }
}
