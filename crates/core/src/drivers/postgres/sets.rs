//! PostgreSQL's set lane: hops that are ready at once share one transaction whose
//! statements each serve all of them.
//!
//! On PostgreSQL a statement's cost is its execution (executor start, constraint and
//! index work, the round trip's system calls), not its commit, and it varies little
//! with the number of rows it writes. So the lane takes the hops waiting (up to
//! [`MAX_BATCH`], at most one per saga and one per message) and, in one transaction:
//!
//! 1. records all their messages in the inbox in one statement (`unnest`), which says
//!    which are first deliveries;
//! 2. runs each [`Prefetch`](crate::read::Prefetch)'s load once for all the
//!    batch's keys (the saga engine's: lock the sagas in id order, then read their
//!    steps), and gives each hop its rows;
//! 3. hands the transaction to each hop in turn. A hop that writes only through
//!    [`Tx::write_last`] after [`Hop::defer_next_write`](crate::Hop::defer_next_write) (the engine's save and next
//!    messages) runs no statement: its writes are kept as data. A hop that runs
//!    statements of its own ([`Tx::conn`]) is *dirty*;
//! 4. writes the kept data, one statement per kind of row for the whole batch, and the
//!    messages in at most two (those handed over directly, written leased; the rest);
//! 5. commits, and answers every hop.
//!
//! A hop that rolls back undoes only itself: its kept data is dropped, its inbox
//! record deleted, and if it ran statements, they are rolled back to the savepoint it
//! ran in. Savepoints cost round trips, so a hop gets one only if its consumer was
//! seen dirty before (in this process); a dirty hop that rolls back without one fails
//! the transaction instead (its hops fail with [`Error::SharedCommit`], which their
//! callers retry, and the hops not yet run get a fresh batch), and its consumer's hops
//! get savepoints from then on (per lane). A failed write of the batch's data, or a
//! failed commit, fails the batch's hops alike: nothing of them is written. A hop whose
//! savepoint cannot be released (its statements failed the subtransaction) is undone
//! alone and gets the database's error.
//!
//! Locks: the batch locks its sagas in one statement in id order, so two batches
//! never deadlock on sagas; a hop outside the lane locks one saga. Rows that hops lock
//! with statements of their own are held to the batch's commit: two batches can
//! deadlock on them, and PostgreSQL then fails one. A hop waiting on another
//! connection for a lock its batch holds would hang the lane: the lane's watchdog
//! ends the batch's session once the hop has held its turn past
//! [`StoreConfig::hop_timeout`](crate::StoreConfig::hop_timeout) (and PostgreSQL after
//! 60 s idle in its transaction, whichever comes first); the hops it kept are retried,
//! those not yet run get a batch of their own.

// A PostgreSQL-only build has no other connection than PostgreSQL's.
#![allow(irrefutable_let_patterns)]

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::batch::{forget, open, probe, terminate, undo};
pub(crate) use super::request::Request;
use crate::store::crash_hook;
use crate::store::prefetch::{Prefetch, Prefetched};
use crate::store::types::{Admitted, Caller, Counts, End, GivenBack, Hop, Waiting};
use crate::store::{Receipt, Store, Tx};
use crate::{Error, MessageId, Result};

/// The next hop waiting for the lane, as its request.
async fn recv(queue: &mut mpsc::UnboundedReceiver<Waiting>) -> Option<Request> {
    loop {
        if let Some(r) = Request::of(queue.recv().await?) {
            return Some(r);
        }
    }
}

/// The next hop already waiting for the lane, if any, as its request.
fn try_recv(queue: &mut mpsc::UnboundedReceiver<Waiting>) -> Option<Request> {
    loop {
        if let Some(r) = Request::of(queue.try_recv().ok()?) {
            return Some(r);
        }
    }
}

/// Largest number of hops in one transaction.
const MAX_BATCH: usize = 64;

/// How many set lanes a store runs, each a batch at a time on a connection of its
/// own; a saga's hops always go to the same one. Two: one batch's statements run while
/// the other's hops take their turns (measured 2026-11-26 on the saga bench: one lane
/// made 2,040 / 1,520 sagas/s, two 2,010–2,140 / 1,720–1,770, three 1,770 / 1,590,
/// four 1,400 / 1,230).
pub(crate) const LANES: usize = 2;

/// A turn of a hop on PostgreSQL: in a set lane if it opens with a set read
/// ([`Prefetch`], a [`Load`](crate::read::Load)) and the configuration allows it (see
/// [`StoreConfig::set_lane`](crate::StoreConfig::set_lane)), else a transaction of
/// its own (which reads nothing for it).
pub(crate) async fn admit(
    store: &Store,
    inbox: Option<(String, MessageId)>,
    prefetch: Option<Prefetch>,
) -> Result<Admitted> {
    if let (Some((consumer, id)), Some((key, load))) = (
        inbox,
        prefetch
            .filter(|p| p.load.check().is_ok())
            .map(|p| (p.key, p.load)),
    ) && store.config().set_lane
        && store.config().max_pending.is_none()
    {
        let (admitted, mine) = oneshot::channel();
        let request = Waiting {
            store: store.clone(),
            inbox: Some((consumer, id)),
            prefetch: Some(Prefetch::load(load, key)),
            caller: Caller::current(),
            admitted,
        };
        if sender(store, key).is_none_or(|s| s.send(request).is_err()) {
            return Err(Error::SharedCommit("the set lane stopped".into()));
        }
        return mine
            .await
            .unwrap_or_else(|_| Err(Error::SharedCommit("the set lane stopped".into())));
    }
    let hop = Hop::own(Tx::begin(store).await?, Arc::clone(&store.lanes().counts));
    Ok((hop, None, None))
}

/// The set lane of saga `key`: always the same one, so that a saga's hops never
/// wait for another lane's batch.
fn sender(store: &Store, key: Uuid) -> Option<&mpsc::UnboundedSender<Waiting>> {
    let lanes = store.lanes();
    let senders = lanes.queues.get_or_init(|| {
        (0..LANES)
            .map(|_| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(lane(rx, Arc::clone(&lanes.counts)));
                tx
            })
            .collect()
    });
    senders.get((key.as_u128() % senders.len().max(1) as u128) as usize)
}

/// The set lane: takes the waiting hops, a batch at a time, until the store is
/// dropped.
pub(crate) async fn lane(mut queue: mpsc::UnboundedReceiver<Waiting>, counts: Arc<Counts>) {
    // Hops put back: another of their saga or message was in the batch.
    let mut held: VecDeque<Request> = VecDeque::new();
    // Consumers seen running statements of their own: their hops get savepoints.
    let mut writers: HashSet<String> = HashSet::new();
    loop {
        let first = match held.pop_front() {
            Some(first) => first,
            None => match recv(&mut queue).await {
                Some(first) => first,
                None => break,
            },
        };
        let mut sagas = HashSet::from([first.key]);
        let mut messages = HashSet::from([(first.consumer.clone(), first.id)]);
        let mut batch = vec![first];
        let mut again = VecDeque::new();
        while batch.len() < MAX_BATCH {
            let Some(r) = held.pop_front().or_else(|| try_recv(&mut queue)) else {
                break;
            };
            if sagas.contains(&r.key) || messages.contains(&(r.consumer.clone(), r.id)) {
                again.push_back(r);
                continue;
            }
            sagas.insert(r.key);
            messages.insert((r.consumer.clone(), r.id));
            batch.push(r);
        }
        again.extend(held.drain(..));
        held = again;
        let unrun = run(batch, &counts, &mut writers).await;
        for r in unrun.into_iter().rev() {
            held.push_front(r);
        }
    }
}

fn fail(requests: impl IntoIterator<Item = Request>, why: &str) {
    for r in requests {
        let _ = r.admitted.send(Err(Error::SharedCommit(why.to_owned())));
    }
}

fn fail_kept(kept: Vec<oneshot::Sender<Result<()>>>, why: &str) {
    for done in kept {
        let _ = done.send(Err(Error::SharedCommit(why.to_owned())));
    }
}

/// Runs one batch; returns the hops it did not run (their batch failed before their
/// turn), for a batch of their own.
async fn run(
    batch: Vec<Request>,
    counts: &Arc<Counts>,
    writers: &mut HashSet<String>,
) -> Vec<Request> {
    let store = batch[0].store.clone();
    let mut tx = match Tx::begin(&store).await {
        Ok(tx) => tx,
        Err(e) => {
            fail(batch, &format!("no transaction could be begun: {e}"));
            return Vec::new();
        }
    };
    let (pid, opened) = match open(&mut tx, &batch).await {
        Ok(opened) => opened,
        Err(e) => {
            tracing::warn!(error = %e, hops = batch.len(), "a set batch failed to open; its hops will be retried");
            let _ = tx.rollback().await;
            fail(batch, &format!("the shared transaction failed: {e}"));
            return Vec::new();
        }
    };
    tx.start_sets();
    let mut kept: Vec<oneshot::Sender<Result<()>>> = Vec::new();
    // A hop ran statements of its own outside a savepoint: one of them may have
    // failed the transaction unseen (its error swallowed), which PostgreSQL would
    // answer to the COMMIT with a rollback that sqlx does not report.
    let mut unguarded = false;
    let mut requests = batch.into_iter().zip(opened).collect::<VecDeque<_>>();
    while let Some((request, (receipt, read))) = requests.pop_front() {
        let first = receipt == Receipt::First;
        let savepoint = first && writers.contains(&request.consumer);
        if savepoint && let Err(e) = tx.savepoint_op("SAVEPOINT agentsaga_hop").await {
            return abort(tx, kept, requests, request, &e).await;
        }
        let mark = tx.kept_mut().map(|k| k.mark()).unwrap_or_default();
        let handed = tx.handed_mark();
        if let Some(k) = tx.kept_mut() {
            k.dirty = false;
            k.deferrable = false;
        }
        let (back, returned) = oneshot::channel();
        let hop = Hop::in_lane(tx, back, Arc::clone(counts));
        let consumer = request.consumer.clone();
        let id = request.id;
        // A duplicate read nothing: it gets no read (which would say "no such row").
        let read = (receipt == Receipt::First).then_some(read);
        let _ = request.admitted.send(Ok((hop, Some(receipt), read)));
        let bound = store.config().hop_timeout;
        let GivenBack { tx: mut t, end } = match tokio::time::timeout(bound, returned).await {
            Ok(Ok(back)) => back,
            Ok(Err(_)) => {
                fail_kept(kept, "a shared transaction was lost");
                fail(
                    requests.into_iter().map(|(r, _)| r),
                    "a shared transaction was lost",
                );
                return Vec::new();
            }
            Err(_) => {
                // The watchdog: the hop holds the batch's transaction past its bound.
                // Its session is ended (its transaction rolled back, its locks
                // released); when it comes back its commit finds the lane gone.
                tracing::error!(
                    consumer = %consumer,
                    message_id = %id,
                    bound_ms = bound.as_millis() as u64,
                    hops = kept.len(),
                    "a hop held its set lane past hop_timeout: it fails, and so do the hops kept before it in its batch (retried)"
                );
                terminate(&store, pid).await;
                fail_kept(
                    kept,
                    "the shared transaction was ended: a hop of its batch held it past hop_timeout",
                );
                return requests.into_iter().map(|(r, _)| r).collect();
            }
        };
        let dirty = t.kept_mut().is_some_and(|k| k.dirty);
        if dirty && !savepoint {
            writers.insert(consumer.clone());
            unguarded = true;
        }
        match end {
            End::Commit(done) => {
                if savepoint && let Err(e) = t.savepoint_op("RELEASE SAVEPOINT agentsaga_hop").await
                {
                    // Its statements left the transaction failed (PostgreSQL refuses
                    // to release then): undo this hop alone.
                    if let Some(k) = t.kept_mut() {
                        k.truncate(mark);
                    }
                    t.cancel_handed_since(handed);
                    let undone = match undo(&mut t).await {
                        Ok(()) if first => forget(&mut t, &consumer, id).await,
                        undone => undone,
                    };
                    let _ = done.send(Err(e));
                    if let Err(e) = undone {
                        return abort_unrun(t, kept, requests, &e).await;
                    }
                    tx = t;
                    continue;
                }
                kept.push(done);
            }
            End::Rollback => {
                if let Some(k) = t.kept_mut() {
                    k.truncate(mark);
                }
                t.cancel_handed_since(handed);
                if dirty && !savepoint {
                    // Its statements cannot be undone alone.
                    let e = Error::SharedCommit(format!(
                        "a hop of `{consumer}` rolled back statements it ran without a savepoint"
                    ));
                    return abort_unrun(t, kept, requests, &e).await;
                }
                if savepoint && let Err(e) = undo(&mut t).await {
                    return abort_unrun(t, kept, requests, &e).await;
                }
                if first && let Err(e) = forget(&mut t, &consumer, id).await {
                    return abort_unrun(t, kept, requests, &e).await;
                }
            }
        }
        tx = t;
    }
    let flushed = match tx.flush_sets().await {
        Ok(()) if unguarded => probe(&mut tx).await,
        flushed => flushed,
    };
    if let Err(e) = flushed {
        tracing::warn!(error = %e, hops = kept.len(), "a set batch's writes failed; its hops will be retried");
        let _ = tx.rollback().await;
        fail_kept(kept, &format!("the shared transaction failed: {e}"));
        return Vec::new();
    }
    // Probed above if a hop ran statements unguarded; a guarded hop's failed
    // statement failed its savepoint's release, and the hop was undone.
    tx.checked();
    crash_hook::stop_if(crash_hook::At::Before, kept.len()).await;
    #[cfg(feature = "testing")]
    counts
        .crash
        .stop_if_reached(crash_hook::At::Before, kept.len())
        .await;
    match tx.commit().await {
        Ok(()) => {
            crash_hook::stop_if(crash_hook::At::After, kept.len()).await;
            #[cfg(feature = "testing")]
            counts
                .crash
                .stop_if_reached(crash_hook::At::After, kept.len())
                .await;
            counts.commits.fetch_add(1, Ordering::Relaxed);
            counts.hops.fetch_add(kept.len() as u64, Ordering::Relaxed);
            for done in kept {
                let _ = done.send(Ok(()));
            }
        }
        Err(e) => fail_kept(kept, &format!("the shared commit failed: {e}")),
    }
    Vec::new()
}

/// The batch cannot go on: rolls it back, fails the hops kept and `current`, and
/// returns the hops not yet run.
async fn abort(
    tx: Tx,
    kept: Vec<oneshot::Sender<Result<()>>>,
    requests: VecDeque<(Request, (Receipt, Prefetched))>,
    current: Request,
    why: &Error,
) -> Vec<Request> {
    let _ = current.admitted.send(Err(Error::SharedCommit(format!(
        "the shared transaction failed: {why}"
    ))));
    abort_unrun(tx, kept, requests, why).await
}

async fn abort_unrun(
    tx: Tx,
    kept: Vec<oneshot::Sender<Result<()>>>,
    requests: VecDeque<(Request, (Receipt, Prefetched))>,
    why: &Error,
) -> Vec<Request> {
    tracing::warn!(error = %why, hops = kept.len(), "a set batch failed; its hops will be retried");
    let _ = tx.rollback().await;
    fail_kept(kept, &format!("the shared transaction failed: {why}"));
    requests.into_iter().map(|(r, _)| r).collect()
}
