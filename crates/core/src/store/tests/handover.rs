//! Direct handover: messages written leased to the local relay, handed over on commit.

use super::*;
use crate::testing::wait_until;

// Direct handover: rows for a destination with a free slot are written leased and
// handed over on commit (never claimable meanwhile); past the slots, for a keyed row
// whose key is live, for a delayed row, or in a transaction that rolls back, nothing is
// handed over and the slot is given back; a handed-over row whose lease expires comes
// back to the pool like a claimed one.
async fn direct_handover(backend: Backend) {
    let (store, _) = open(backend).await;
    let fake = FakeHandover::installed(&store, 3, Duration::from_millis(300));
    let used = || *fake.used.lock().unwrap();

    // Rolled back: nothing taken, slot back.
    let mut tx = store.begin().await.unwrap();
    tx.enqueue(&Message::to("direct").json(&0).unwrap())
        .await
        .unwrap();
    assert_eq!(used(), 1);
    tx.rollback().await.unwrap();
    assert_eq!(used(), 0);
    assert!(fake.taken.lock().unwrap().is_empty());

    // Two keyed rows of one key, a delayed one, another destination, then past the cap.
    let Mix {
        first,
        second,
        delayed,
        other,
        more,
    } = Mix::new();
    let mut tx = store.begin().await.unwrap();
    tx.enqueue_batch(&[
        first.clone(),
        second.clone(),
        delayed.clone(),
        other.clone(),
    ])
    .await
    .unwrap();
    tx.enqueue_batch(&more).await.unwrap();
    // Not claimable before the commit, nor after: leased.
    assert!(fake.taken.lock().unwrap().is_empty());
    tx.commit().await.unwrap();
    let taken: Vec<MessageId> = fake.taken.lock().unwrap().iter().map(|e| e.id).collect();
    assert_eq!(taken, vec![first.id, more[0].id, more[1].id]);
    assert_eq!(used(), 3);
    for e in fake.taken.lock().unwrap().iter() {
        assert_eq!(e.attempts, 1);
        assert!(e.seq > 0);
    }
    // What was not handed over is pending, in order; the second row of key k waits
    // for the first, which is in flight.
    let d = dests(&["direct", "elsewhere"]);
    let claimed: Vec<MessageId> = claim_n(&store, "other-relay", &d, 10)
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(claimed, vec![other.id, more[2].id]);
    let stats = store.admin().stats().await.unwrap();
    assert_eq!(stats.in_flight, 5);

    // The handed-over rows are the fake relay's: it acknowledges one; the lease of the
    // others expires and they come back (the first of key k, then the second).
    let acked = fake.taken.lock().unwrap()[1].seq;
    assert_eq!(
        store
            .queue()
            .mark_delivered("fake-relay", &[acked])
            .await
            .unwrap(),
        1
    );
    let mut back = 0;
    wait_until(
        "the fake relay's leases expire",
        Duration::from_secs(30),
        async || {
            back += store.queue().reclaim_expired().await.unwrap();
            back >= 2
        },
    )
    .await;
    let again: Vec<MessageId> = claim_n(&store, "other-relay", &dests(&["direct"]), 10)
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(again, vec![first.id, more[1].id]);

    // In a hop whose savepoint is rolled back, the slot comes back too.
    store.remove_handover(&(Arc::clone(&fake) as Arc<dyn crate::handover::Handover>));
    *fake.used.lock().unwrap() = 0;
    store.set_handover(Arc::clone(&fake) as _);
    let mut kept = store.hop().await.unwrap();
    kept.enqueue(&Message::to("elsewhere").json(&9).unwrap())
        .await
        .unwrap();
    let s2 = store.clone();
    let undone = tokio::spawn(async move {
        let mut hop = s2.hop().await.unwrap();
        hop.enqueue(&Message::to("direct").json(&10).unwrap())
            .await
            .unwrap();
        hop.rollback().await.expect("rollback");
    });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    kept.commit().await.unwrap();
    undone.await.unwrap();
    // `rollback` returns at once; the lane undoes the hop right after.
    wait_until(
        "the undone hop's slot is back",
        Duration::from_secs(1),
        async || used() == 0,
    )
    .await;
    assert_eq!(fake.taken.lock().unwrap().len(), 3);
}
both_backends!(handover_tests, direct_handover);

// Guarantee 3 under concurrent producers: many overlapping transactions each enqueue a
// message of one key to a destination taking direct handover, and commit. At most one
// row of the key may be in flight at once, and at most one handed over; the others wait
// pending, in order. (Before the unique `outbox_key_in_flight`, PostgreSQL let every
// producer that could not see the others' uncommitted rows write its row in flight.)
async fn concurrent_producers_of_one_key(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = Store::connect_with(&url, StoreConfig::default().max_connections(24))
        .await
        .unwrap();
    let fake = FakeHandover::installed(&store, 100, Duration::from_secs(30));
    const N: usize = 16;
    let barrier = Arc::new(tokio::sync::Barrier::new(N));
    let mut tasks = Vec::new();
    for i in 0..N {
        let store = store.clone();
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let mut tx = store.begin().await.unwrap();
            tx.enqueue(&Message::to("direct").key("k1").json(&i).unwrap())
                .await
                .unwrap();
            // Overlap: all commit together where the database lets them all get here
            // (PostgreSQL before the fix). A producer that is made to wait for another
            // (SQLite's single writer; the unique index) must not wait for it here:
            // the wait is bounded.
            let _ = tokio::time::timeout(Duration::from_millis(500), barrier.wait()).await;
            tx.commit().await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let stats = store.admin().stats().await.unwrap();
    assert_eq!(stats.in_flight, 1, "{stats:?}");
    assert_eq!(stats.pending, N as u64 - 1, "{stats:?}");
    assert_eq!(fake.taken.lock().unwrap().len(), 1);
    // The handed-over row done, the next of the key is claimable, one at a time.
    let first = fake.taken.lock().unwrap()[0].seq;
    store
        .queue()
        .mark_delivered("fake-relay", &[first])
        .await
        .unwrap();
    let d = dests(&["direct"]);
    assert_eq!(claim_n(&store, "r", &d, 10).await.len(), 1);
    assert!(claim_n(&store, "r2", &d, 10).await.is_empty());
}
both_backends!(concurrent_producers_tests, concurrent_producers_of_one_key);
