//! Several relays on one database; a relay that died.

use std::collections::HashMap;
use std::time::Duration;

use agentsaga_core::Store;
use agentsaga_core::queue::Claim;
use agentsaga_core::testing::{Backend, fresh_url};
use serde_json::json;

use crate::support::{Scripted, config, enqueue, msg, start, store, wait_delivered, wait_until};

async fn two_relays_deliver_everything_once(backend: Backend) {
    let url = fresh_url(backend).await;
    let one = Store::connect(&url).await.unwrap();
    let two = Store::connect(&url).await.unwrap();
    let (t1, t2) = (Scripted::new(), Scripted::new());
    t1.jitter(1);
    t2.jitter(1);
    let cfg = || config().workers(4).batch_size(20);
    let r1 = start(&one, &["a", "b"], &t1, cfg()).await;
    let r2 = start(&two, &["a", "b"], &t2, cfg()).await;

    let mut ids = Vec::new();
    for chunk in 0..8 {
        let batch: Vec<_> = (0..50)
            .map(|i| {
                let dest = if i % 2 == 0 { "a" } else { "b" };
                let key = (i % 3 != 0).then(|| format!("k{}", i % 17));
                msg(dest, key.as_deref(), json!([chunk, i]))
            })
            .collect();
        // Enqueue through both stores: each wakes its own relay, and on Postgres the
        // other through NOTIFY.
        let store = if chunk % 2 == 0 { &one } else { &two };
        ids.extend(enqueue(store, &batch).await);
    }
    wait_until("all 400 are delivered", || async {
        one.admin().stats().await.unwrap().delivered == 400
    })
    .await;
    // The relays count an acknowledgement once its statement has returned.
    wait_until("both relays counted theirs", || async {
        r1.stats().delivered + r2.stats().delivered == 400
    })
    .await;

    let mut count: HashMap<_, usize> = HashMap::new();
    for call in t1.calls().into_iter().chain(t2.calls()) {
        *count.entry(call.envelope.id).or_default() += 1;
    }
    assert_eq!(count.len(), 400);
    let twice: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    assert!(ids.iter().all(|id| count.contains_key(id)));
    eprintln!(
        "{backend:?}: relay one delivered {}, relay two {}",
        r1.stats().delivered,
        r2.stats().delivered
    );
    r1.shutdown().await;
    r2.shutdown().await;
}
agentsaga_core::both_backends!(two_relays, two_relays_deliver_everything_once);

async fn a_dead_relays_rows_are_delivered_after_its_lease(backend: Backend) {
    let store = store(backend).await;
    let batch = [
        msg("a", Some("k"), json!(0)),
        msg("a", Some("k"), json!(1)),
        msg("a", Some("k2"), json!(2)),
        msg("a", None, json!(3)),
        msg("a", None, json!(4)),
    ];
    enqueue(&store, &batch).await;
    // The dead relay claimed what it could, then died without a word.
    let destinations = vec!["a".to_owned()];
    let lease = Duration::from_millis(600);
    let claimed_at = tokio::time::Instant::now();
    let taken = store
        .queue()
        .claim(&Claim {
            owner: "dead-relay",
            destinations: &destinations,
            limit: 100,
            lease,
        })
        .await
        .unwrap();
    assert_eq!(
        taken.len(),
        4,
        "the second row of key k waits behind the first"
    );

    let t = Scripted::new();
    let relay = start(
        &store,
        &["a"],
        &t,
        config().lease(Duration::from_millis(400)),
    )
    .await;
    wait_delivered(&relay, 5).await;

    let calls = t.calls();
    let first = calls.iter().map(|c| c.at).min().unwrap();
    assert!(
        first - claimed_at >= lease - Duration::from_millis(50),
        "delivered {:?} after the dead relay's claim, before its lease ran out",
        first - claimed_at
    );
    for c in calls
        .iter()
        .filter(|c| taken.iter().any(|e| e.seq == c.envelope.seq))
    {
        assert_eq!(c.envelope.attempts, 2, "the dead relay's attempt counts");
    }
    let s = store.admin().stats().await.unwrap();
    assert_eq!((s.delivered, s.in_flight, s.pending), (5, 0, 0));
    relay.shutdown().await;
}
agentsaga_core::both_backends!(dead_relay, a_dead_relays_rows_are_delivered_after_its_lease);

// A row handed over is written leased inside the producer's transaction, so its lease
// counts from that INSERT. A transaction left open longer than the lease commits a row
// whose lease has run out: another relay may claim it at once. The relay it was handed
// to must then not deliver it too (its fence counts from the same moment as the lease):
// one delivery at a time, the effect once.
async fn a_row_handed_over_after_a_long_transaction_is_delivered_once(backend: Backend) {
    let url = fresh_url(backend).await;
    let one = Store::connect(&url).await.unwrap();
    let two = Store::connect(&url).await.unwrap();
    let (t1, t2) = (Scripted::new(), Scripted::new());
    // Each delivery outlasts the lease: only renewals keep it the relay's.
    let lease = Duration::from_millis(1000);
    t1.delay("a", lease * 2);
    t2.delay("a", lease * 2);
    let r1 = start(&one, &["a"], &t1, config().lease(lease).handover(true)).await;
    let r2 = start(&two, &["a"], &t2, config().lease(lease)).await;
    let mut tx = one.begin().await.unwrap();
    tx.enqueue(&msg("a", Some("k"), json!(1))).await.unwrap();
    tokio::time::sleep(lease * 2).await;
    tx.commit().await.unwrap();
    wait_until("the row is delivered", || async {
        one.admin().stats().await.unwrap().delivered == 1
    })
    .await;
    r1.shutdown().await;
    r2.shutdown().await;
    let (c1, c2) = (t1.calls().len(), t2.calls().len());
    assert_eq!(
        c1 + c2,
        1,
        "delivered {c1} time(s) by the relay it was handed to, {c2} by the other"
    );
}
agentsaga_core::both_backends!(
    long_transaction_handover,
    a_row_handed_over_after_a_long_transaction_is_delivered_once
);
