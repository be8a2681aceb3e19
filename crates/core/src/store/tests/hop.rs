//! Hops and group commit: shared transactions, inbox records and prefetches in a hop's
//! opening, a duplicate waiting for its first hop's commit.

use super::*;

/// Runs `task` for each entry of `plan` (given a store, the entry, and the sender to
/// tell once its hop has queued for the lane), each in a task of its own queued behind
/// the one before (on SQLite), all behind `first`; then commits `first` and returns the
/// tasks' results in plan order.
async fn queued_behind<P, F>(
    store: &Store,
    first: crate::Hop,
    plan: impl IntoIterator<Item = P>,
    task: impl Fn(Store, P, tokio::sync::oneshot::Sender<()>) -> F,
) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut tasks = Vec::new();
    for entry in plan {
        let (queued, is_queued) = tokio::sync::oneshot::channel::<()>();
        tasks.push(tokio::spawn(task(store.clone(), entry, queued)));
        // Queued in plan order: the next task starts after this one has queued.
        is_queued.await.unwrap();
    }
    first.commit().await.unwrap();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    results
}

// Group commit: on SQLite, hops queued behind one that holds the lane share its
// transaction; a hop that rolls back (or fails a statement) undoes only itself, the
// others commit. On PostgreSQL each hop is a transaction of its own.
async fn hops_share_a_commit_and_roll_back_alone(backend: Backend) {
    let (store, _) = open(backend).await;
    // The first hop holds the lane until every other hop has queued behind it.
    let mut first = store.hop().await.unwrap();
    first
        .enqueue(&Message::to("kept").json(&0).unwrap())
        .await
        .unwrap();
    let queued = Arc::new(tokio::sync::Semaphore::new(0));
    let mut tasks = Vec::new();
    for i in 1..=20u32 {
        let store = store.clone();
        let queued = Arc::clone(&queued);
        tasks.push(tokio::spawn(async move {
            let hop = store.hop();
            queued.add_permits(1);
            let mut hop = hop.await.unwrap();
            let dest = if i % 3 == 0 { "undone" } else { "kept" };
            hop.enqueue(&Message::to(dest).json(&i).unwrap())
                .await
                .unwrap();
            match i % 3 {
                0 => {
                    hop.rollback().await.expect("rollback");
                    None
                }
                1 if i % 2 == 1 => {
                    // A failing statement inside the hop, then an attempt to commit
                    // it: this hop alone may fail.
                    hop.enqueue(&Message::to("undone").json(&i).unwrap())
                        .await
                        .unwrap();
                    let bad: Result<u64, sqlx::Error> = with_conn!(hop.conn(), c => {
                        sqlx::query("INSERT INTO no_such_table VALUES (1)")
                            .execute(c)
                            .await
                            .map(|r| r.rows_affected())
                    });
                    assert!(bad.is_err());
                    Some(hop.commit().await.is_ok())
                }
                _ => Some(hop.commit().await.is_ok()),
            }
        }));
    }
    // `hop()` queues when first polled: give every task its turn to queue.
    let _ = queued.acquire_many(20).await.unwrap();
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    first.commit().await.unwrap();
    let mut failed = 0;
    for t in tasks {
        if t.await.unwrap() == Some(false) {
            failed += 1;
        }
    }
    let count = |dest: &'static str| {
        let store = store.clone();
        async move {
            let sql = match dest {
                "kept" => "SELECT count(*) FROM outbox WHERE destination = 'kept'",
                _ => "SELECT count(*) FROM outbox WHERE destination = 'undone'",
            };
            store
                .read(async |c| {
                    Ok(with_conn!(c, c => {
                        sqlx::query_scalar::<_, i64>(sql).fetch_one(c).await?
                    }))
                })
                .await
                .unwrap()
        }
    };
    // Hops 1..=20: 6 rolled back (3, 6, …, 18); 1, 7, 13, 19 failed a statement.
    let stats = store.hop_stats();
    if backend == Backend::Sqlite {
        // One shared transaction at a time; the failed statement alone failed, and its
        // hop committed the rest.
        assert_eq!(failed, 0);
        assert_eq!(count("undone").await, 4);
        assert_eq!(count("kept").await, 1 + 14);
        assert_eq!(stats.hops, 1 + 14);
        assert!(
            stats.commits < stats.hops,
            "queued hops shared a commit: {stats:?}"
        );
    } else {
        // Each hop a transaction of its own. PostgreSQL turns the commit of a
        // transaction in error into a rollback: the commit of those four hops reports
        // it (`Error::RolledBack`), and nothing of them is written.
        assert_eq!(failed, 4);
        assert_eq!(count("undone").await, 0);
        assert_eq!(count("kept").await, 1 + 14 - 4);
        assert_eq!(stats.hops, 1 + 14 - 4);
        assert_eq!(stats.commits, stats.hops);
    }
}
both_backends!(hop_tests, hops_share_a_commit_and_roll_back_alone);

// A hop that opens by recording its message in the inbox (on SQLite in the round trip
// of the savepoint statements): a message recorded and committed before is a
// duplicate (one recorded in the open shared transaction waits for its commit); a hop
// rolled back leaves no record.
async fn hops_receiving_record_once(backend: Backend) {
    let (store, _) = open(backend).await;
    let ids: Vec<MessageId> = (0..8).map(|_| MessageId::new()).collect();
    // Recorded and committed before: a duplicate from then on.
    {
        let (hop, receipt) = store.hop_receiving("agent", ids[0]).await.unwrap();
        assert_eq!(receipt, Receipt::First);
        hop.commit().await.unwrap();
    }
    // The first hop holds the lane until every other hop has queued behind it.
    let first = store.hop().await.unwrap();
    // (message, commit?) in queue order: ids[1] twice (the second a duplicate of the
    // first, answered once the first is committed: on SQLite in the next shared
    // transaction); ids[2] rolled back, then received again; ids[0] a duplicate of a
    // committed record.
    let plan = [
        (ids[1], true),
        (ids[1], true),
        (ids[2], false),
        (ids[2], true),
        (ids[0], true),
        (ids[3], true),
        (ids[4], false),
        (ids[5], true),
    ];
    let plan = plan.into_iter().enumerate();
    let receipts = queued_behind(
        &store,
        first,
        plan,
        |store, (i, (id, keep)), queued| async move {
            let (mut hop, receipt) = after_queueing(store.hop_receiving("agent", id), queued)
                .await
                .unwrap();
            hop.enqueue(&Message::to("out").json(&(i as u32)).unwrap())
                .await
                .unwrap();
            if keep {
                hop.commit().await.unwrap();
            } else {
                hop.rollback().await.expect("rollback");
            }
            receipt
        },
    )
    .await;
    use Receipt::{Duplicate, First};
    if backend == Backend::Sqlite {
        // In queue order (the duplicate of ids[1] after its first's commit).
        assert_eq!(
            receipts,
            [
                First, Duplicate, First, First, Duplicate, First, First, First
            ]
        );
        assert!(store.hop_stats().commits < store.hop_stats().hops);
    } else {
        // Concurrent transactions: of two receipts of ids[1] (both committed) exactly
        // one is first; ids[2] is first at least once (the kept hop's, if its record
        // came after the rollback).
        assert!(
            matches!(
                (receipts[0], receipts[1]),
                (First, Duplicate) | (Duplicate, First)
            ),
            "{receipts:?}"
        );
        assert_eq!(receipts[3], First, "{receipts:?}");
        assert_eq!(receipts[4], Duplicate);
        assert_eq!(receipts[5], First);
        assert_eq!(receipts[7], First);
    }
    // Recorded: ids 0, 1, 2 (by its kept hop), 3, 5; ids[4]'s hop was rolled back.
    for (id, recorded) in [
        (ids[0], true),
        (ids[1], true),
        (ids[2], true),
        (ids[3], true),
        (ids[4], false),
        (ids[5], true),
        (ids[6], false),
    ] {
        assert_eq!(store.seen("agent", id).await.unwrap(), recorded, "{id}");
    }
    let (hop, receipt) = store.hop_receiving("agent", ids[4]).await.unwrap();
    assert_eq!(receipt, First, "a rolled-back record is gone");
    drop(hop);
}
both_backends!(hop_receiving_tests, hops_receiving_record_once);

// A hop that opens with a read (a prefetch; on SQLite in the round trip of its
// savepoint and inbox record, on PostgreSQL by the set lane for its batch) gets the
// rows as the transaction stands when it opens: with the writes of the hops kept before
// it (on SQLite, in the shared transaction), without those of a hop rolled back, also
// when its message is a duplicate.
async fn hops_open_with_their_prefetch(backend: Backend) {
    use crate::read::Load;
    use crate::read::Prefetch;
    use crate::write::{Column, Kind, Table};
    static MISSING: Table = Table::new("no_such_table", &[Column::new("k", Kind::Id)], 1);
    static FAILING: Load = Load::new(&MISSING, &["k"], &LOAD_C, &["i"]);
    let (store, _) = open(backend).await;
    load_tables(&store, backend).await;
    let key = uuid::Uuid::now_v7();
    {
        let mut tx = store.begin().await.unwrap();
        crate::Sql::new("INSERT INTO load_p (k) VALUES (?)")
            .bind(key)
            .execute(tx.conn())
            .await
            .unwrap();
        crate::Sql::new("INSERT INTO load_c (k, i) VALUES (?, 0)")
            .bind(key)
            .execute(tx.conn())
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let count = || Prefetch::load(&LOAD, key);
    let fails = || Prefetch::load(&FAILING, key);
    let ids: Vec<MessageId> = (0..5).map(|_| MessageId::new()).collect();
    // The first hop holds the lane until every other hop has queued behind it (on
    // PostgreSQL, the set lane of `key`).
    let (first, _, _) = store
        .hop_receiving_prefetched("holder", MessageId::new(), Some(count()))
        .await
        .unwrap();
    // (message, read, child written, keep?) in queue order: ids[0] kept; ids[1]
    // rolled back; ids[2] kept; ids[0] again (a duplicate, dropped; opened after the
    // commit); ids[3] with a read that fails; ids[4].
    let plan = [
        (ids[0], count(), 1, true),
        (ids[1], count(), 2, false),
        (ids[2], count(), 3, true),
        (ids[0], count(), 4, true),
        (ids[3], fails(), 5, true),
        (ids[4], count(), 6, true),
    ];
    let results = queued_behind(
        &store,
        first,
        plan,
        |store, (id, read, i, keep), queued| async move {
            let opening = store.hop_receiving_prefetched("agent", id, Some(read));
            let opened = after_queueing(opening, queued).await;
            let (mut hop, receipt, read) = match opened {
                Ok(opened) => opened,
                Err(e) => return Err(e.to_string()),
            };
            let n = read.map(|r| r.loaded().map_or(0, |l| l.children.len() as i64));
            if receipt == Receipt::First {
                crate::Sql::new("INSERT INTO load_c (k, i) VALUES (?, ?)")
                    .bind(key)
                    .bind(i64::from(i))
                    .execute(hop.conn())
                    .await
                    .unwrap();
                if keep {
                    hop.commit().await.unwrap();
                } else {
                    hop.rollback().await.expect("rollback");
                }
            }
            Ok((receipt, n))
        },
    )
    .await;
    use Receipt::{Duplicate, First};
    let read = |n: i64| Some(n);
    if backend == Backend::Sqlite {
        assert_eq!(results[0], Ok((First, read(1))));
        assert_eq!(results[1], Ok((First, read(2))));
        assert_eq!(
            results[2],
            Ok((First, read(2))),
            "a rolled-back write is not read"
        );
        // A second delivery of a message recorded in the open transaction waits for
        // its commit: it opens in the next one, which finds every write of this one.
        assert_eq!(results[3], Ok((Duplicate, read(4))));
        let failed = results[4].as_ref().unwrap_err();
        assert!(failed.contains("no_such_table"), "{failed}");
        assert_eq!(results[5], Ok((First, read(3))));
        assert!(
            !store.seen("agent", ids[3]).await.unwrap(),
            "the failed hop is undone"
        );
    } else {
        // The set lane takes one hop of a key per batch: each reads what the batches
        // before it committed; a duplicate reads nothing; a failed read fails its
        // batch (this hop alone).
        assert_eq!(results[0], Ok((First, read(1))));
        assert_eq!(results[1], Ok((First, read(2))));
        assert_eq!(
            results[2],
            Ok((First, read(2))),
            "a rolled-back write is not read"
        );
        assert_eq!(results[3], Ok((Duplicate, None)), "nothing read");
        let failed = results[4].as_ref().unwrap_err();
        assert!(failed.contains("no_such_table"), "{failed}");
        assert_eq!(results[5], Ok((First, read(3))));
    }
    let rows = crate::Sql::new("SELECT count(*) AS n FROM load_c")
        .fetch_one(store.reader())
        .await
        .unwrap()
        .int("n")
        .unwrap();
    assert_eq!(
        rows, 4,
        "ids[0], ids[2], ids[4] and the seed; ids[1] rolled back"
    );
}
both_backends!(hop_prefetch_tests, hops_open_with_their_prefetch);
// A second delivery of a message whose first hop is not committed yet (on SQLite, kept
// in the lane's shared transaction) is not answered a duplicate before that commit is
// known: if the first hop's transaction then fails, the second delivery is the first
// one that counts, and handles the message.
async fn a_duplicate_waits_for_its_first_hops_commit(backend: Backend) {
    let (store, _) = open(backend).await;
    commit_poison_tables(&store).await;
    let id = MessageId::new();
    // A hop holds the lane (SQLite) until both deliveries have queued behind it: they
    // share its transaction, the second opened in the round trip that ends the first.
    // (On PostgreSQL, where each hop is a transaction of its own, the second starts
    // once the first has recorded the message.)
    let holder = store.hop().await.unwrap();
    let (queued, is_queued) = tokio::sync::oneshot::channel::<()>();
    let (recorded, is_recorded) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let store = store.clone();
        tokio::spawn(async move {
            let (mut hop, receipt) = after_queueing(store.hop_receiving("agent", id), queued)
                .await
                .unwrap();
            assert_eq!(receipt, Receipt::First);
            let _ = recorded.send(());
            hop.enqueue(&Message::to("effect").json(&1).unwrap())
                .await
                .unwrap();
            poison_commit(&mut hop).await;
            hop.commit().await
        })
    };
    is_queued.await.unwrap();
    if backend == Backend::Postgres {
        is_recorded.await.unwrap();
    }
    let (queued, is_queued) = tokio::sync::oneshot::channel::<()>();
    let second = {
        let store = store.clone();
        tokio::spawn(async move {
            let (mut hop, receipt) = after_queueing(store.hop_receiving("agent", id), queued)
                .await
                .unwrap();
            if receipt == Receipt::First {
                hop.enqueue(&Message::to("effect").json(&2).unwrap())
                    .await
                    .unwrap();
                hop.commit().await.unwrap();
            }
            receipt
        })
    };
    is_queued.await.unwrap();
    let held = tokio::spawn(holder.commit());
    let failed = first.await.unwrap();
    assert!(failed.is_err(), "the first hop's commit failed: {failed:?}");
    assert_eq!(
        second.await.unwrap(),
        Receipt::First,
        "the first delivery's record was never committed: the second is not a duplicate"
    );
    let _ = held.await.unwrap();
    assert!(store.seen("agent", id).await.unwrap());
    let effects: i64 = store
        .read(async |c| {
            Ok(with_conn!(c, c => {
                sqlx::query_scalar("SELECT count(*) FROM outbox WHERE destination = 'effect'")
                    .fetch_one(c)
                    .await?
            }))
        })
        .await
        .unwrap();
    assert_eq!(effects, 1, "the message's effects are written once");
}
both_backends!(
    duplicate_wait_tests,
    a_duplicate_waits_for_its_first_hops_commit
);
