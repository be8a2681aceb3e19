//! `Store::begin`, the one way to open a transaction: the store chooses how it runs (on
//! SQLite, a turn in the running hops' shared transaction, or a transaction of its own
//! when none run), refuses a task that asks while it holds one, bounds a turn, and is
//! left clean by a caller that goes away.

use super::*;

/// Begins, enqueues one message to `dest`, commits.
async fn write_one(store: &Store, dest: &str) -> crate::Result<()> {
    let mut tx = store.begin().await?;
    tx.enqueue(&Message::to(dest).json(&1).unwrap()).await?;
    tx.commit().await
}

/// The destinations of the messages to `names` that were written, sorted.
#[cfg(feature = "sqlite")]
async fn claimed(store: &Store, names: &[&str]) -> Vec<String> {
    let got = claim_n(store, "r", &dests(names), 10).await;
    let mut seen: Vec<_> = got.into_iter().map(|e| e.destination).collect();
    seen.sort_unstable();
    seen
}

// A transaction of either backend is atomic on its own: committed it is written,
// rolled back or dropped it is not, and the task begins again at once after each.
async fn a_begin_commits_or_leaves_nothing(backend: Backend) {
    let (store, _) = open(backend).await;
    write_one(&store, "kept").await.unwrap();
    let mut undone = store.begin().await.unwrap();
    undone
        .enqueue(&Message::to("undone").json(&2).unwrap())
        .await
        .unwrap();
    undone.rollback().await.unwrap();
    let mut dropped = store.begin().await.unwrap();
    dropped
        .enqueue(&Message::to("undone").json(&3).unwrap())
        .await
        .unwrap();
    drop(dropped);
    write_one(&store, "kept").await.unwrap();
    let got = claim_n(&store, "r", &dests(&["kept", "undone"]), 10).await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.iter().all(|e| e.destination == "kept"));
    store.close().await;
}
both_backends!(begin_tests, a_begin_commits_or_leaves_nothing);

// While hops run, `begin` is a turn in their shared transaction: queued behind the turn
// that holds SQLite's lane, it commits with it, one commit for both. (Were it a
// transaction of its own, it would wait for the writer and commit alone: two commits.)
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_begin_joins_the_running_hops() {
    let (store, _) = open(Backend::Sqlite).await;
    let mut held = store.hop().await.unwrap();
    held.enqueue(&Message::to("held").json(&0).unwrap())
        .await
        .unwrap();
    let (queued, is_queued) = tokio::sync::oneshot::channel::<()>();
    let user = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut tx = after_queueing(store.begin(), queued).await?;
            tx.enqueue(&Message::to("user").json(&1).unwrap()).await?;
            tx.commit().await
        })
    };
    is_queued.await.unwrap();
    let before = store.hop_stats();
    held.commit().await.unwrap();
    user.await.unwrap().unwrap();
    let after = store.hop_stats();
    assert_eq!(after.hops - before.hops, 2, "{before:?} -> {after:?}");
    assert_eq!(
        after.commits - before.commits,
        1,
        "the begin committed in the shared transaction it queued for: {before:?} -> {after:?}"
    );
    let got = claim_n(&store, "r", &dests(&["held", "user"]), 10).await;
    assert_eq!(got.len(), 2, "{got:?}");
    store.close().await;
}

// A task that holds SQLite's writer (a transaction of its own, or a turn in the lane)
// and begins again would wait for itself: it is refused past `hop_timeout`, with a typed error,
// and what it holds is unharmed. Another task is not refused: it waits its turn. Once
// the first ends (commit, rollback or drop), the task begins again at once.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_a_nested_begin_is_refused_not_hung() {
    let store = open_bounded(Backend::Sqlite).await;
    // Bounded: without the check the nested begin waits for the writer its own task
    // holds; with it, it waits `hop_timeout` (300 ms) for a sibling future to let go.
    let nested = |store: Store| async move {
        tokio::time::timeout(Duration::from_secs(10), store.begin())
            .await
            .expect("a nested begin is refused instead of waiting for itself")
    };
    // No hop runs: the outer transaction is one of its own.
    let mut outer = store.begin().await.unwrap();
    outer
        .enqueue(&Message::to("outer").json(&0).unwrap())
        .await
        .unwrap();
    let refused = nested(store.clone()).await;
    assert!(
        matches!(refused, Err(Error::NestedTransaction)),
        "{refused:?}"
    );
    assert!(!Error::NestedTransaction.is_transient());
    let other = {
        let store = store.clone();
        tokio::spawn(async move { write_one(&store, "other").await })
    };
    outer.commit().await.unwrap();
    other.await.unwrap().unwrap();
    // A turn in the lane, held by this task: the same. The refusal came after
    // `hop_timeout`, so the lane's watchdog may undo the turn (its commit then fails,
    // transient, nothing of it written), or find it back in time.
    let mut turn = store.hop().await.unwrap();
    turn.enqueue(&Message::to("turn").json(&0).unwrap())
        .await
        .unwrap();
    let refused = nested(store.clone()).await;
    assert!(
        matches!(refused, Err(Error::NestedTransaction)),
        "{refused:?}"
    );
    let turn_kept = match turn.commit().await {
        Ok(()) => true,
        Err(e @ Error::SharedCommit(_)) if e.is_transient() => false,
        Err(e) => panic!("{e:?}"),
    };
    // Ended by a rollback, a drop: begins again at once.
    store.begin().await.unwrap().rollback().await.unwrap();
    drop(store.hop().await.unwrap());
    write_one(&store, "after").await.unwrap();
    let seen = claimed(&store, &["outer", "other", "turn", "after"]).await;
    let expected: &[&str] = if turn_kept {
        &["after", "other", "outer", "turn"]
    } else {
        &["after", "other", "outer"]
    };
    assert_eq!(seen, expected);
    store.close().await;
}

// A `begin` that joined the running hops holds their lane: past `hop_timeout` its turn
// is let go, its commit fails (transient) with nothing written, and the hops queued
// behind it commit. The same transaction had it begun alone would have been written:
// the bound is the price of joining, and `hop_timeout` sets it.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_a_begin_held_past_hop_timeout_is_undone() {
    let store = open_bounded(Backend::Sqlite).await;
    let held = store.hop().await.unwrap();
    let (queued, is_queued) = tokio::sync::oneshot::channel::<()>();
    let slow = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut tx = after_queueing(store.begin(), queued).await.unwrap();
            tx.enqueue(&Message::to("slow").json(&0).unwrap())
                .await
                .unwrap();
            // Past the bound (a wait on purpose: the lane must let the bound pass).
            tokio::time::sleep(Duration::from_millis(900)).await;
            tx.commit().await
        })
    };
    is_queued.await.unwrap();
    let (behind, is_behind) = tokio::sync::oneshot::channel::<()>();
    let after = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut tx = after_queueing(store.begin(), behind).await?;
            tx.enqueue(&Message::to("after").json(&1).unwrap()).await?;
            tx.commit().await
        })
    };
    is_behind.await.unwrap();
    held.commit().await.unwrap();
    let late = slow.await.unwrap();
    assert!(
        matches!(&late, Err(e @ Error::SharedCommit(_)) if e.is_transient()),
        "a begin back past its bound is undone: {late:?}"
    );
    after.await.unwrap().unwrap();
    let got = claim_n(&store, "r", &dests(&["slow", "after"]), 10).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].destination, "after");
    store.close().await;
}

// A caller that goes away leaves nothing behind: a begin cancelled while it waits for
// its turn, and a task aborted while it holds one, neither write nor hold the lane; the
// store's next transactions, in any task, go on.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_a_cancelled_begin_leaves_the_lane_free() {
    let (store, _) = open(Backend::Sqlite).await;
    let mut held = store.hop().await.unwrap();
    held.enqueue(&Message::to("held").json(&0).unwrap())
        .await
        .unwrap();
    // Cancelled while queued behind the held turn.
    let (queued, is_queued) = tokio::sync::oneshot::channel::<()>();
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut tx = after_queueing(store.begin(), queued).await.unwrap();
            tx.enqueue(&Message::to("cancelled").json(&1).unwrap())
                .await
                .unwrap();
            tx.commit().await
        })
    };
    is_queued.await.unwrap();
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    held.commit().await.unwrap();
    // Aborted while it holds its transaction (never committed).
    let (holding, is_holding) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut tx = store.begin().await.unwrap();
            tx.enqueue(&Message::to("cancelled").json(&2).unwrap())
                .await
                .unwrap();
            let _ = holding.send(());
            std::future::pending::<()>().await;
            drop(tx);
        })
    };
    is_holding.await.unwrap();
    holder.abort();
    assert!(holder.await.unwrap_err().is_cancelled());
    tokio::time::timeout(Duration::from_secs(10), write_one(&store, "after"))
        .await
        .expect("the lane is free again")
        .unwrap();
    let seen = claimed(&store, &["held", "cancelled", "after"]).await;
    assert_eq!(seen, ["after", "held"]);
    store.close().await;
}

// Two futures of one task (here the test's body, outside any task: one thread) that
// begin side by side are not nesting: the second waits for the first to end, on both
// kinds of SQLite transaction, and both commit.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_begins_side_by_side_in_one_task_take_turns() {
    let (store, _) = open(Backend::Sqlite).await;
    let (a, b) = side_by_side(store.clone(), "a", "b").await;
    a.unwrap();
    b.unwrap();
    // The same with the lane running: a turn held by another task.
    let held = store.hop().await.unwrap();
    let joined = tokio::spawn(side_by_side(store.clone(), "c", "d"));
    // Let both queue behind the held turn (bounded: they cannot end before it does).
    tokio::time::sleep(Duration::from_millis(50)).await;
    held.commit().await.unwrap();
    let (c, d) = joined.await.unwrap();
    c.unwrap();
    d.unwrap();
    let got = claim_n(&store, "r", &dests(&["a", "b", "c", "d"]), 10).await;
    assert_eq!(got.len(), 4, "{got:?}");
    store.close().await;
}

#[cfg(feature = "sqlite")]
/// Two futures joined in the caller's task: the first begins, enqueues to `first`, and
/// holds its transaction across an await; the second begins once the first holds it,
/// and enqueues to `second`.
async fn side_by_side(
    store: Store,
    first: &'static str,
    second: &'static str,
) -> (crate::Result<()>, crate::Result<()>) {
    let (holds, held) = tokio::sync::oneshot::channel::<()>();
    let one = async {
        let mut tx = store.begin().await?;
        tx.enqueue(&Message::to(first).json(&1).unwrap()).await?;
        let _ = holds.send(());
        tokio::task::yield_now().await;
        tx.commit().await
    };
    let two = async {
        let _ = held.await;
        let mut tx = store.begin().await?;
        tx.enqueue(&Message::to(second).json(&2).unwrap()).await?;
        tx.commit().await
    };
    tokio::join!(one, two)
}
