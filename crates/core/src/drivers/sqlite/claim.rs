//! The relay's claim and acknowledgement on SQLite, as statements the lane can run on
//! its connection directly (the relay's writes as a hop of the lane).

use sqlx::SqliteConnection;

use super::dialect::seq_list;
use super::direct::Session;
use super::statements::{Statement, Value};
use super::tail::direct_envelope;
use super::{ClaimTimes, Sqlite};
use crate::clock::millis;
use crate::store::backend::envelope;
use crate::store::queue_types::Claim;
use crate::{Envelope, Result};

impl Sqlite {
    /// The claim, on a connection of the caller's (the relay runs it in a hop).
    pub(crate) async fn claim_on(
        c: &mut SqliteConnection,
        claim: &Claim<'_>,
        at: ClaimTimes,
    ) -> Result<Vec<Envelope>> {
        let mut query = sqlx::query(CLAIM);
        for value in claim_values(claim, at)? {
            query = query.bind(value);
        }
        let rows = query.fetch_all(c).await?;
        rows.iter().map(envelope).collect()
    }

    /// Marks rows delivered, on a connection of the caller's.
    pub(crate) async fn mark_delivered_on(
        c: &mut SqliteConnection,
        owner: &str,
        seqs: &[i64],
        now: i64,
    ) -> Result<u64> {
        let mut query = sqlx::query(MARK_DELIVERED);
        for value in mark_values(owner, seqs, now) {
            query = query.bind(value);
        }
        let r = query.execute(c).await?;
        Ok(r.rows_affected())
    }
}

/// The relay's claim: its values are [`claim_values`].
const CLAIM: &str = "UPDATE outbox
             SET state = 'in_flight', lease_owner = ?1, lease_until = ?2, attempts = attempts + 1
             WHERE seq IN (
                 SELECT o.seq FROM outbox o
                 WHERE o.state = 'pending' AND o.available_at <= ?3
                   AND o.destination IN (SELECT value FROM json_each(?4))
                   AND (o.key IS NULL OR (
                       NOT EXISTS (SELECT 1 FROM outbox p
                           WHERE p.key = o.key AND p.seq < o.seq
                             AND p.key IS NOT NULL AND p.state IN ('pending', 'in_flight'))
                       AND NOT EXISTS (SELECT 1 FROM outbox f
                           WHERE f.key = o.key AND f.key IS NOT NULL AND f.state = 'in_flight')))
                 ORDER BY o.seq
                 LIMIT ?5)
             RETURNING seq, id, destination, key, payload, headers, attempts, created_at";

/// The claim's values, in the order of its parameters.
fn claim_values(claim: &Claim<'_>, at: ClaimTimes) -> Result<Vec<Value>> {
    Ok(vec![
        Value::Text(claim.owner.to_owned()),
        Value::Int(at.lease_now.saturating_add(millis(claim.lease))),
        Value::Int(at.now),
        Value::Text(serde_json::to_string(claim.destinations)?),
        Value::Int(i64::from(claim.limit)),
    ])
}

/// The relay's acknowledgement: its values are [`mark_values`].
const MARK_DELIVERED: &str = "UPDATE outbox
             SET state = 'delivered', delivered_at = ?1, lease_owner = NULL, lease_until = NULL
             WHERE seq IN (SELECT value FROM json_each(?2))
               AND state = 'in_flight' AND lease_owner = ?3";

/// The acknowledgement's values, in the order of its parameters.
fn mark_values(owner: &str, seqs: &[i64], now: i64) -> Vec<Value> {
    vec![
        Value::Int(now),
        Value::Text(seq_list(seqs)),
        Value::Text(owner.to_owned()),
    ]
}

impl Sqlite {
    /// Marks `delivered` rows delivered for `claim.owner` (if any), then claims (if
    /// `claim.limit` > 0), with `session` on the lane's connection directly: the
    /// relay's writes as a hop of the lane.
    pub(crate) fn ack_and_claim_direct(
        session: &mut Session,
        delivered: &[i64],
        claim: &Claim<'_>,
        at: ClaimTimes,
    ) -> Result<(u64, Vec<Envelope>)> {
        let mut marked = 0;
        if !delivered.is_empty() {
            let st =
                Statement::numbered(MARK_DELIVERED, mark_values(claim.owner, delivered, at.now));
            session.run(&st, |_| {})?;
            marked = session.changes();
        }
        let mut rows = Vec::new();
        if !claim.destinations.is_empty() && claim.limit > 0 {
            let st = Statement::numbered(CLAIM, claim_values(claim, at)?);
            session.run(&st, |row| rows.push(row))?;
        }
        let claimed = rows.iter().map(direct_envelope).collect::<Result<_>>()?;
        Ok((marked, claimed))
    }
}
