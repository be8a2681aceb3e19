//! SQLite's lane: one task that owns SQLite's single writer and hands one open
//! transaction to each waiting hop in turn (group commit, see the `hop` module).
//!
//! Every hop after the first in a transaction runs inside a savepoint, so a hop that
//! rolls back undoes only itself; the first needs none (rolling back the transaction
//! undoes only it, and the lane begins a fresh one). When no caller is waiting, the
//! lane commits and answers every hop of the batch: a hop counts as committed only
//! then.
//!
//! The lane runs its statements on the connection directly, not through sqlx's thread
//! (see [`direct`](super::direct)), and keeps the connection from one shared
//! transaction to the next while callers keep coming (at most [`HOLD`]). A hop costs
//! as few statement groups as it can: the group that ends a hop (releases its
//! savepoint) also opens the next one (sets its savepoint, records its message in the
//! inbox, runs its [`Prefetch`](crate::read::Prefetch) read), and starts with the ended
//! hop's last write if the hop deferred it (its [`tail`](super::tail)). The count of
//! statements that completed says whose failure a failed group was: the ended hop's
//! (it alone is undone), the transaction's (abandoned), or the next hop's (it alone
//! fails).
//!
//! SQLite's lane cannot take its writer back from a hop's holder: it undoes a hop
//! that comes back past [`StoreConfig::hop_timeout`](crate::StoreConfig::hop_timeout)
//! (its commit fails) and logs the wait.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{mpsc, oneshot};

use super::tx::{abort, begin_shared, end_shared, fail_all, undo};
use crate::store::crash_hook;
use crate::store::prefetch::{Prefetch, Prefetched};
use crate::store::types::{Admitted, Caller, Counts, End, GivenBack, Hop, Waiting};
use crate::store::{Receipt, Store, Tx};
use crate::{Error, MessageId, Result};

/// A caller waiting for its turn in SQLite's lane.
type Request = Waiting;

/// Largest number of hops in one transaction: bounds how long a commit keeps the
/// first hop of a batch waiting.
const MAX_BATCH: usize = 64;

/// How a hop's first round trip begins (the hop's own statements, its inbox record,
/// follow in the same round trip): nothing (the first hop of a transaction), its
/// savepoint, or the release of the hop before it and its savepoint (on SQLite, one
/// hand-off to the connection's thread instead of up to three).
const OPEN_FIRST: (&str, usize) = ("", 0);
const OPEN_SET: (&str, usize) = ("SAVEPOINT agentsaga_hop;\n", 1);
const OPEN_RELEASE_AND_SET: (&str, usize) = (
    "RELEASE SAVEPOINT agentsaga_hop;\nSAVEPOINT agentsaga_hop;\n",
    2,
);
/// Ends a hop when no caller is waiting: the release of its savepoint alone.
const CLOSE: (&str, usize) = ("RELEASE SAVEPOINT agentsaga_hop;\n", 1);

/// What the commit of a hop that came back to SQLite's lane past its bound says.
const LATE: &str = "this hop held its turn in the shared transaction past \
     StoreConfig::hop_timeout: it was undone, nothing of it was written";

/// How long the lane keeps its connection (SQLite's writer) from one shared
/// transaction to the next while callers keep coming: past it, the connection goes back
/// to the pool between two, so that the store's other writers (a [`Store::begin`], the
/// relay's statements outside hops) get their turn. Keeping it saves giving it back
/// (sqlx pings a connection it takes back) and taking it again, a few round trips to
/// the connection's thread per transaction.
pub(crate) const HOLD: std::time::Duration = std::time::Duration::from_millis(10);

/// A lane: takes the waiting callers, a batch at a time, until the store is dropped.
async fn lane(mut queue: mpsc::UnboundedReceiver<Request>, counts: Arc<Counts>) {
    // The connection kept from the last batch, and since when it is held.
    let mut spare: Option<(Tx, std::time::Instant)> = None;
    // Callers put back by the last batch (their message was recorded in it): first.
    let mut held: VecDeque<Request> = VecDeque::new();
    loop {
        let first = match held.pop_front().map_or_else(|| queue.try_recv(), Ok) {
            Ok(first) => first,
            Err(mpsc::error::TryRecvError::Disconnected) => break,
            Err(mpsc::error::TryRecvError::Empty) => {
                // Idle: the connection is kept for the rest of its time, then goes back
                // to the pool.
                let waited = match &spare {
                    Some((_, since)) => {
                        let left = HOLD.saturating_sub(since.elapsed());
                        tokio::time::timeout(left, queue.recv()).await.ok()
                    }
                    None => None,
                };
                match waited {
                    Some(Some(first)) => first,
                    Some(None) => break,
                    None => {
                        spare = None;
                        counts.busy.store(false, Ordering::Release);
                        match queue.recv().await {
                            Some(first) => first,
                            None => break,
                        }
                    }
                }
            }
        };
        if spare
            .as_ref()
            .is_some_and(|(_, since)| since.elapsed() >= HOLD)
        {
            spare = None;
        }
        let since = spare.as_ref().map(|(_, since)| *since);
        counts.busy.store(true, Ordering::Release);
        let kept = batch(
            first,
            &mut queue,
            &mut held,
            &counts,
            spare.take().map(|(t, _)| t),
        )
        .await;
        spare = kept.map(|t| (t, since.unwrap_or_else(std::time::Instant::now)));
        if spare.is_none() {
            counts.busy.store(false, Ordering::Release);
        }
    }
    counts.busy.store(false, Ordering::Release);
}

/// A message recorded in the inbox by a hop of the open shared transaction.
type Recorded = HashSet<(String, MessageId)>;

/// The next caller that may join the batch: the first waiting (those `held` back by
/// the last batch first) whose message no hop of the open transaction has recorded.
/// The others are put back in `again`, for the next batch: a second delivery of a
/// message is answered only once the first's commit is known (a duplicate if it
/// committed; if it failed, the second delivery is the first that counts).
fn pull(
    queue: &mut mpsc::UnboundedReceiver<Request>,
    held: &mut VecDeque<Request>,
    recorded: &Recorded,
    again: &mut VecDeque<Request>,
) -> Option<Request> {
    loop {
        let r = held.pop_front().or_else(|| queue.try_recv().ok())?;
        if r.inbox.as_ref().is_some_and(|m| recorded.contains(m)) {
            again.push_back(r);
            continue;
        }
        return Some(r);
    }
}

/// Runs one shared transaction: hands it to `first`, then to each caller waiting,
/// then commits and answers them all. Callers whose message a hop of the transaction
/// recorded are put back in `held`, first for the next batch.
async fn batch(
    first: Request,
    queue: &mut mpsc::UnboundedReceiver<Request>,
    held: &mut VecDeque<Request>,
    counts: &Arc<Counts>,
    spare: Option<Tx>,
) -> Option<Tx> {
    let mut again = VecDeque::new();
    let kept = batch_of(first, queue, held, &mut again, counts, spare).await;
    again.extend(held.drain(..));
    *held = again;
    kept
}

async fn batch_of(
    first: Request,
    queue: &mut mpsc::UnboundedReceiver<Request>,
    held: &mut VecDeque<Request>,
    again: &mut VecDeque<Request>,
    counts: &Arc<Counts>,
    mut spare: Option<Tx>,
) -> Option<Tx> {
    let mut next = Some(first);
    // The messages the hops of the open transaction recorded.
    let mut recorded = Recorded::new();
    // The hops kept so far, waiting for the commit.
    let mut kept: Vec<oneshot::Sender<Result<()>>> = Vec::new();
    let mut tx: Option<Tx> = None;
    let mut taken = 0usize;
    // The next hop was opened (savepoint set, inbox recorded) by the round trip that
    // released the hop before it: what its inbox record found.
    let mut opened: Option<(Option<Receipt>, Option<Prefetched>)> = None;
    while let Some(request) = next.take().or_else(|| {
        if taken < MAX_BATCH {
            pull(queue, held, &recorded, again)
        } else {
            None
        }
    }) {
        taken += 1;
        if taken > 2 * MAX_BATCH {
            // Transactions keep failing: let the callers' retries take it from here.
            let _ = request.admitted.send(Err(Error::SharedCommit(
                "shared transactions keep failing".into(),
            )));
            break;
        }
        let mut t = match tx.take() {
            Some(t) => t,
            None => match begin_shared(&request.store, spare.take()).await {
                Ok(t) => {
                    recorded.clear();
                    t
                }
                Err(e) => {
                    // Nothing kept yet (a transaction is begun only with none open).
                    let _ = request.admitted.send(Err(e));
                    continue;
                }
            },
        };
        let savepoint = !kept.is_empty();
        let (receipt, read) = match opened.take() {
            Some(opened) => opened,
            None => {
                let (prefix, statements) = if savepoint { OPEN_SET } else { OPEN_FIRST };
                let inbox = request.inbox.as_ref().map(|(c, id)| (c.as_str(), *id));
                match t
                    .open_hop(prefix, statements, inbox, request.prefetch.as_ref())
                    .await
                {
                    Ok(opened) => opened,
                    Err((done, e)) if done < statements => {
                        // The savepoint failed: the transaction is failed (on
                        // PostgreSQL, a statement of the first hop, which has no
                        // savepoint, failed and the hop committed anyway), so its hops
                        // are not written. This caller gets a fresh transaction.
                        abort(t, std::mem::take(&mut kept), &e).await;
                        next = Some(request);
                        continue;
                    }
                    Err((_, e)) => {
                        // Its inbox record failed: this hop alone fails.
                        let _ = request.admitted.send(Err(e));
                        if savepoint {
                            let mark = t.handed_mark();
                            if let Err(e) = undo(&mut t, mark).await {
                                abort(t, std::mem::take(&mut kept), &e).await;
                                continue;
                            }
                            tx = Some(t);
                        } else if let Err(e) = t.rollback().await {
                            tracing::debug!(error = %e, "rollback of a shared transaction failed");
                        }
                        continue;
                    }
                }
            }
        };
        if receipt == Some(Receipt::First)
            && let Some(m) = &request.inbox
        {
            recorded.insert(m.clone());
        }
        let mark = t.handed_mark();
        let (back, returned) = oneshot::channel();
        let hop = Hop::in_lane(t, back, Arc::clone(counts));
        // The hop clears it when it gives its turn back.
        *counts
            .holder
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(request.caller);
        // A caller that went away drops the hop it is sent, which gives it back.
        let _ = request.admitted.send(Ok((hop, receipt, read)));
        let bound = request.store.config().hop_timeout;
        let mut returned = returned;
        let (returned, late) = match tokio::time::timeout(bound, &mut returned).await {
            Ok(returned) => (returned, false),
            Err(_) => {
                // The watchdog. The hop holds the single writer (its transaction is
                // the lane's, and the holder may hold a borrow of its connection):
                // the lane cannot take it back, only wait, and undo the hop when it
                // returns.
                tracing::error!(
                    bound_ms = bound.as_millis() as u64,
                    hops = kept.len(),
                    "a hop has held SQLite's lane past hop_timeout: every write of the process waits for it; it will be undone when it returns"
                );
                (returned.await, true)
            }
        };
        let Ok(GivenBack { tx: mut t, end }) = returned else {
            // The transaction was lost with its caller (it cannot be: a hop gives it
            // back when dropped); what was kept is not written.
            fail_all(kept, "a shared transaction was lost");
            return None;
        };
        let end = match end {
            End::Commit(done) if late => {
                // Past its bound: undone like a rollback, and told so.
                let _ = done.send(Err(Error::SharedCommit(LATE.into())));
                End::Rollback
            }
            end => end,
        };
        match (end, savepoint) {
            (End::Commit(done), false) => {
                kept.push(done);
                tx = Some(t);
            }
            (End::Commit(done), true) => {
                // The release; a caller already waiting is opened in the same round
                // trip.
                let ahead = if taken < MAX_BATCH {
                    pull(queue, held, &recorded, again)
                } else {
                    None
                };
                let (prefix, statements) = if ahead.is_some() {
                    OPEN_RELEASE_AND_SET
                } else {
                    CLOSE
                };
                let inbox = ahead
                    .as_ref()
                    .and_then(|a| a.inbox.as_ref())
                    .map(|(c, id)| (c.as_str(), *id));
                let prefetch = ahead.as_ref().and_then(|a| a.prefetch.as_ref());
                let opening = t.open_hop(prefix, statements, inbox, prefetch).await;
                next = ahead;
                match opening {
                    Ok(receipt) => {
                        kept.push(done);
                        tx = Some(t);
                        if next.is_some() {
                            opened = Some(receipt);
                        }
                    }
                    // The release failed (its statements left the transaction failed:
                    // PostgreSQL refuses to release then): undo this hop alone; the
                    // caller ahead opens its hop in a round trip of its own.
                    Err((0, e)) => match undo(&mut t, mark).await {
                        Ok(()) => {
                            let _ = done.send(Err(e));
                            tx = Some(t);
                        }
                        Err(e2) => {
                            let _ = done.send(Err(e));
                            abort(t, std::mem::take(&mut kept), &e2).await;
                        }
                    },
                    Err((1, e)) => {
                        // Released, but no new savepoint: the transaction cannot be
                        // trusted. Nothing of it is written, this hop included; the
                        // caller ahead gets a fresh transaction.
                        kept.push(done);
                        abort(t, std::mem::take(&mut kept), &e).await;
                    }
                    Err((_, e)) => {
                        // This hop is kept; the inbox record of the caller ahead
                        // failed: that hop alone fails.
                        kept.push(done);
                        if let Some(ahead) = next.take() {
                            let _ = ahead.admitted.send(Err(e));
                        }
                        let mark = t.handed_mark();
                        match undo(&mut t, mark).await {
                            Ok(()) => tx = Some(t),
                            Err(e2) => abort(t, std::mem::take(&mut kept), &e2).await,
                        }
                    }
                }
            }
            (End::Rollback, false) => {
                // The first hop: rolling back the transaction undoes only it.
                t.drop_tail();
                let (ended, kept_conn) = end_shared(t, false).await;
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "rollback of a shared transaction failed");
                }
                spare = kept_conn;
            }
            (End::Rollback, true) => {
                t.drop_tail();
                if let Err(e) = undo(&mut t, mark).await {
                    abort(t, std::mem::take(&mut kept), &e).await;
                    continue;
                }
                tx = Some(t);
            }
        }
    }
    let Some(mut t) = tx else { return spare };
    // The last write the first hop deferred, if it was the only one.
    if let Err(e) = t.flush_tail().await {
        abort(t, kept, &e).await;
        return None;
    }
    crash_hook::stop_if(crash_hook::At::Before, kept.len()).await;
    #[cfg(feature = "testing")]
    counts
        .crash
        .stop_if_reached(crash_hook::At::Before, kept.len())
        .await;
    let (committed, kept_conn) = end_shared(t, true).await;
    match committed {
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
        Err(e) => fail_all(kept, &format!("the shared commit failed: {e}")),
    }
    kept_conn
}

/// A turn in SQLite's lane (see the `hop` module): queued for the lane's task, started on
/// the first hop.
pub(crate) async fn admit(
    store: &Store,
    inbox: Option<(String, MessageId)>,
    prefetch: Option<Prefetch>,
) -> Result<Admitted> {
    store.not_holding().await?;
    let lanes = store.lanes();
    let (admitted, mine) = oneshot::channel();
    let request = Request {
        store: store.clone(),
        inbox,
        prefetch,
        caller: Caller::current(),
        admitted,
    };
    let senders = lanes.queues.get_or_init(|| {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(lane(rx, Arc::clone(&lanes.counts)));
        vec![tx]
    });
    let Some(sender) = senders.first() else {
        return Err(Error::SharedCommit("the commit lanes stopped".into()));
    };
    if sender.send(request).is_err() {
        return Err(Error::SharedCommit("the commit lanes stopped".into()));
    }
    mine.await
        .unwrap_or_else(|_| Err(Error::SharedCommit("the commit lane stopped".into())))
}
