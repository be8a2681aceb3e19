//! The operator's calls: pruning and stats.

use super::*;

/// `prune` (of the records older than its argument) spares records younger than an
/// hour and, once they are 20 ms old (time that must pass in the database's clock),
/// takes the `n` of them older than 1 ms.
pub(super) async fn prunes_by_age(prune: impl AsyncFn(Duration) -> u64, n: u64) {
    assert_eq!(prune(Duration::from_secs(3600)).await, 0);
    // Wall-clock time (the records' age is measured by the database's clock); a poll
    // would not do: a prune that takes fewer than `n` is the failure to catch.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(prune(Duration::from_millis(1)).await, n);
}

// Prune delivered rows by age; stats count states and report the lag.
async fn prune_and_stats(backend: Backend) {
    let (store, _) = open(backend).await;
    let d = dests(&["a"]);
    for i in 0..3 {
        enqueue_one(&store, &Message::to("a").json(&i).unwrap()).await;
    }
    enqueue_one(&store, &Message::to("a").delay(Duration::from_secs(3600))).await;
    // The pending rows must age by the database's clock (their age is a column's
    // distance from now): wall-clock time, which tokio's paused clock cannot move.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let stats = store.admin().stats().await.unwrap();
    assert_eq!(stats.pending, 4);
    assert!(stats.oldest_pending_age_ms.unwrap() >= 20, "{stats:?}");
    let got = claim_n(&store, "r", &d, 2).await;
    assert_eq!(got.len(), 2);
    let stats = store.admin().stats().await.unwrap();
    assert_eq!((stats.pending, stats.in_flight), (2, 2));
    store
        .queue()
        .mark_delivered("r", &[got[0].seq, got[1].seq])
        .await
        .unwrap();
    let prune = async |age| store.admin().prune_delivered(age).await.unwrap();
    prunes_by_age(prune, 2).await;
    let stats = store.admin().stats().await.unwrap();
    assert_eq!((stats.pending, stats.in_flight, stats.delivered), (2, 0, 0));
    let got = claim_n(&store, "r", &d, 10).await;
    assert_eq!(got.len(), 1, "the timer is not due");
    assert_eq!(
        store.admin().stats().await.unwrap().oldest_pending_age_ms,
        None
    );
}
both_backends!(prune_stats_tests, prune_and_stats);

// The rows waiting per destination: pending and in flight counted, delivered and dead
// not, destinations without any left out.
async fn waiting_per_destination(backend: Backend) {
    let (store, _) = open(backend).await;
    for d in ["b", "a", "a", "a", "c"] {
        enqueue_one(&store, &Message::to(d)).await;
    }
    enqueue_one(&store, &Message::to("b").delay(Duration::from_secs(3600))).await;
    let got = claim_n(&store, "r", &dests(&["a", "c"]), 10).await;
    assert_eq!(got.len(), 4);
    let c = got.iter().find(|e| e.destination == "c").unwrap();
    store.queue().mark_delivered("r", &[c.seq]).await.unwrap();
    let a = got.iter().find(|e| e.destination == "a").unwrap();
    store.queue().mark_delivered("r", &[a.seq]).await.unwrap();
    let rows = store.admin().waiting_by_destination().await.unwrap();
    let rows: Vec<(&str, u64, u64)> = rows
        .iter()
        .map(|r| (r.destination.as_str(), r.pending, r.in_flight))
        .collect();
    assert_eq!(rows, [("a", 0, 2), ("b", 2, 0)]);
}
both_backends!(waiting_tests, waiting_per_destination);
