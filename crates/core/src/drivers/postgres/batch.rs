//! The statements a set batch runs for itself: its opening (the inbox records and the
//! reads of all its hops at once), and its repairs (a probe of the transaction, a hop's
//! savepoint undone, its inbox record forgotten, a stuck session ended).

// A PostgreSQL-only build has no other connection than PostgreSQL's.
#![allow(irrefutable_let_patterns)]

use std::collections::{HashMap, HashSet};

use sqlx::Row as _;
use uuid::Uuid;

use super::request::Request;
use crate::drivers::Backend;
use crate::read::{Load, Loaded};
use crate::store::prefetch::Prefetched;
use crate::store::{Receipt, Row, Store, Tx};
use crate::{Error, MessageId, Result};

/// Fails if the transaction is failed (a statement in it failed).
pub(crate) async fn probe(t: &mut Tx) -> Result<()> {
    let Some(c) = t.conn_clean().into_postgres() else {
        return Ok(());
    };
    sqlx::query("SELECT 1").execute(c).await?;
    Ok(())
}

pub(crate) async fn undo(t: &mut Tx) -> Result<()> {
    t.savepoint_op("ROLLBACK TO SAVEPOINT agentsaga_hop")
        .await?;
    t.savepoint_op("RELEASE SAVEPOINT agentsaga_hop").await
}

/// Deletes the inbox record of a hop that rolled back (the batch wrote it first).
pub(crate) async fn forget(t: &mut Tx, consumer: &str, id: MessageId) -> Result<()> {
    let Some(c) = t.conn_clean().into_postgres() else {
        return Ok(());
    };
    sqlx::query("DELETE FROM inbox WHERE consumer = $1 AND message_id = $2")
        .bind(consumer)
        .bind(id)
        .execute(c)
        .await?;
    Ok(())
}

/// Ends the session `pid` (a batch's, whose hop is past the watchdog's bound) from
/// another connection: its transaction is rolled back and its locks released, so that
/// the hops behind it do not wait for them.
pub(crate) async fn terminate(store: &Store, pid: i32) {
    let Backend::Postgres(db) = store.backend_ref() else {
        return;
    };
    if let Err(e) = sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&db.pool)
        .await
    {
        // PostgreSQL still ends it once idle in its transaction for 60 s (see `open`).
        tracing::warn!(error = %e, pid, "a stuck set batch's session could not be ended");
    }
}

/// The batch's session (its backend's pid), inbox records and reads: each hop's
/// receipt and rows, in order.
pub(crate) async fn open(
    tx: &mut Tx,
    batch: &[Request],
) -> Result<(i32, Vec<(Receipt, Prefetched)>)> {
    let Some(c) = tx.conn_clean().into_postgres() else {
        return Err(Error::BackendMismatch {
            store: "postgres",
            connection: "sqlite",
        });
    };
    // A hop that waits, on another connection, for a lock this batch holds (its
    // handler signalling its own saga through a transaction of its own, say) would
    // wait forever, and so would its lane: PostgreSQL sees no cycle. Past this, it
    // ends the batch's session instead (the batch fails and its hops are retried).
    // Its pid, for the watchdog (see `run`).
    let pid: i32 = sqlx::query_scalar(
        "SELECT pg_backend_pid()
         FROM set_config('idle_in_transaction_session_timeout', '60s', true)",
    )
    .fetch_one(&mut *c)
    .await?;
    let consumers: Vec<&str> = batch.iter().map(|r| r.consumer.as_str()).collect();
    let ids: Vec<MessageId> = batch.iter().map(|r| r.id).collect();
    let firsts: HashSet<(String, Uuid)> = sqlx::query(
        "INSERT INTO inbox (consumer, message_id)
         SELECT * FROM unnest($1::text[], $2::uuid[])
         ON CONFLICT DO NOTHING
         RETURNING consumer, message_id",
    )
    .bind(&consumers)
    .bind(&ids)
    .fetch_all(&mut *c)
    .await?
    .iter()
    .map(|row| Ok((row.try_get("consumer")?, row.try_get("message_id")?)))
    .collect::<std::result::Result<_, sqlx::Error>>()?;
    let receipts: Vec<Receipt> = batch
        .iter()
        .map(|r| {
            if firsts.contains(&(r.consumer.clone(), *r.id.as_uuid())) {
                Receipt::First
            } else {
                Receipt::Duplicate
            }
        })
        .collect();
    // The reads, once per load, for the first deliveries' keys.
    let mut reads: Vec<Prefetched> = batch.iter().map(|_| Prefetched::default()).collect();
    let mut loads: Vec<&'static Load> = Vec::new();
    for (r, receipt) in batch.iter().zip(&receipts) {
        if *receipt == Receipt::First && !loads.iter().any(|l| std::ptr::eq(*l, r.load)) {
            loads.push(r.load);
        }
    }
    for load in loads {
        let mine = |r: &Request, receipt: &Receipt| {
            *receipt == Receipt::First && std::ptr::eq(r.load, load)
        };
        let mut keys: Vec<Uuid> = batch
            .iter()
            .zip(&receipts)
            .filter(|(r, receipt)| mine(r, receipt))
            .map(|(r, _)| r.key)
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let [parents, children] = crate::drivers::postgres::Postgres::load_sql(load, true);
        let mut by_key: HashMap<Uuid, (Option<Row>, Vec<Row>)> = HashMap::new();
        for (n, sql) in [parents, children].into_iter().enumerate() {
            let mut pick = None;
            for row in sqlx::query(sql).bind(&keys).fetch_all(&mut *c).await? {
                let key: Uuid = row.try_get("prefetch_key")?;
                let mut row = Row::from_postgres(&row)?;
                let pick =
                    pick.get_or_insert_with(|| row.pick(|c| (c != "prefetch_key").then_some(c)));
                let row = pick.take(&mut row);
                let entry = by_key.entry(key).or_default();
                if n == 0 {
                    entry.0 = Some(row);
                } else {
                    entry.1.push(row);
                }
            }
        }
        for ((r, receipt), read) in batch.iter().zip(&receipts).zip(reads.iter_mut()) {
            if mine(r, receipt) {
                // A batch holds one hop per key (it puts a key's second hop back).
                let (parent, children) = by_key.remove(&r.key).unwrap_or_default();
                read.loaded = parent.map(|parent| Loaded { parent, children });
            }
        }
    }
    Ok((pid, receipts.into_iter().zip(reads).collect()))
}
