//! A message written straight into the dead letters (`Tx::enqueue_dead`).

use super::*;

// Written dead with its reason, listed, never claimed; an id already stored (dead or
// pending) is left as it is; a message the store does not take is refused, typed.
async fn enqueue_dead(backend: Backend) {
    let (store, _) = open(backend).await;
    let dead = Message::to("a")
        .key("k")
        .raw_json(r#""not an envelope""#)
        .header("nats_subject", "agentsaga.a");
    let pending = Message::to("a").key("k").json(&1).unwrap();
    enqueue_one(&store, &pending).await;

    let mut tx = store.begin().await.unwrap();
    assert!(tx.enqueue_dead(&dead, "malformed envelope").await.unwrap());
    assert!(
        !tx.enqueue_dead(&dead, "again").await.unwrap(),
        "its id is stored"
    );
    assert!(
        !tx.enqueue_dead(&pending, "x").await.unwrap(),
        "a pending id"
    );
    let too_large = Message::to("a").raw_json(format!("\"{}\"", "x".repeat(2 << 20)));
    assert!(matches!(
        tx.enqueue_dead(&too_large, "x").await,
        Err(Error::PayloadTooLarge { .. })
    ));
    assert!(matches!(
        tx.enqueue_dead(&Message::to("a").raw_json("{"), "x").await,
        Err(Error::Json(_))
    ));
    assert!(matches!(
        tx.enqueue_dead(&Message::to(" ").json(&1).unwrap(), "x")
            .await,
        Err(Error::EmptyDestination)
    ));
    tx.commit().await.unwrap();

    let rows = store.admin().dead_letters(Some("a"), 10).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].last_error.as_deref(), Some("malformed envelope"));
    let e = &rows[0].envelope;
    assert_eq!((e.id, e.key.as_deref()), (dead.id, Some("k")));
    assert_eq!(e.payload, r#""not an envelope""#);
    assert_eq!(e.header("nats_subject"), Some("agentsaga.a"));
    let stats = store.admin().stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (1, 1));
    // The dead row holds no key back: the pending row of its key is claimable.
    let got = claim_n(&store, "r", &dests(&["a"]), 10).await;
    assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), [pending.id]);
    // A rolled back dead letter was never written.
    let mut tx = store.begin().await.unwrap();
    let other = Message::to("a").json(&2).unwrap();
    assert!(tx.enqueue_dead(&other, "x").await.unwrap());
    tx.rollback().await.unwrap();
    assert_eq!(store.admin().stats().await.unwrap().dead, 1);
}
both_backends!(enqueue_dead_tests, enqueue_dead);
