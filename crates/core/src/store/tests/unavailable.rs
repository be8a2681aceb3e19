//! Rows waiting for a destination that cannot be reached spend no attempts.

use super::*;

// A retry that spends nothing (the destination could not be reached) keeps the row's
// attempts where they were, and counts as waiting for its destination.
async fn unspent_retry_keeps_attempts(backend: Backend) {
    let (store, _) = open(backend).await;
    let d = dests(&["a"]);
    enqueue_one(&store, &Message::to("a").key("k")).await;
    for round in 0..4 {
        let got = claim_n(&store, "r", &d, 10).await;
        assert_eq!(got.len(), 1, "round {round}");
        assert_eq!(
            got[0].attempts, 1,
            "round {round}: an unreachable broker spent it"
        );
        let n = store
            .queue()
            .retry_later(
                "r",
                &[Retry {
                    seq: got[0].seq,
                    delay: Duration::ZERO,
                    error: "unavailable: broker away".into(),
                    spent: false,
                }],
            )
            .await
            .unwrap();
        assert_eq!(n, 1);
    }
    let stats = store.admin().stats().await.unwrap();
    assert_eq!((stats.pending, stats.unavailable), (1, 1));
    let rows = store.admin().waiting_by_destination().await.unwrap();
    assert_eq!(rows[0].unavailable, 1);
    assert_eq!(
        rows[0].unavailable_reason.as_deref(),
        Some("unavailable: broker away")
    );
    // A spent retry counts again.
    let got = claim_n(&store, "r", &d, 10).await;
    store
        .queue()
        .retry_later(
            "r",
            &[Retry {
                seq: got[0].seq,
                delay: Duration::ZERO,
                error: "boom".into(),
                spent: true,
            }],
        )
        .await
        .unwrap();
    assert_eq!(claim_n(&store, "r", &d, 10).await[0].attempts, 2);
    assert_eq!(store.admin().stats().await.unwrap().unavailable, 0);
}
both_backends!(unspent_retry_tests, unspent_retry_keeps_attempts);
