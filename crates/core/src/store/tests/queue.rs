//! The relay's protocol: claims, acknowledgements, per-key order, leases, retries and
//! dead letters, late commits.

use super::*;
use crate::testing::wait_until;

// Four concurrent claimers (on two pools) never hold the same row.
async fn concurrent_claimers_never_share_a_row(backend: Backend) {
    let (store, url) = open(backend).await;
    let other = Store::connect(&url).await.unwrap();
    let d = dests(&["a"]);
    let batch: Vec<_> = (0..400)
        .map(|i| Message::to("a").json(&i).unwrap())
        .collect();
    let mut tx = store.begin().await.unwrap();
    tx.enqueue_batch(&batch).await.unwrap();
    tx.commit().await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for c in 0..4 {
        let s = if c % 2 == 0 {
            store.clone()
        } else {
            other.clone()
        };
        let d = d.clone();
        let seen = seen.clone();
        tasks.push(tokio::spawn(async move {
            let owner = format!("c{c}");
            loop {
                let got = claim_n(&s, &owner, &d, 7).await;
                if got.is_empty() {
                    break;
                }
                let seqs: Vec<_> = got.iter().map(|e| e.seq).collect();
                seen.lock().unwrap().extend(seqs.iter().copied());
                tokio::task::yield_now().await;
                assert_eq!(
                    s.queue().mark_delivered(&owner, &seqs).await.unwrap(),
                    seqs.len() as u64
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let seen = seen.lock().unwrap();
    let unique: HashSet<_> = seen.iter().collect();
    assert_eq!(seen.len(), 400);
    assert_eq!(unique.len(), 400, "a row was claimed twice");
}
both_backends!(
    concurrent_claim_tests,
    concurrent_claimers_never_share_a_row
);

// Acknowledging and claiming in one call: the claim sees the acknowledged rows as
// delivered (the key's next row comes out), rows not leased to the owner are not
// counted, and an empty acknowledgement is a plain claim.
async fn ack_and_claim(backend: Backend) {
    let (store, _) = open(backend).await;
    let d = dests(&["a"]);
    let msgs: Vec<_> = (0..3)
        .map(|i| Message::to("a").key("k").json(&i).unwrap())
        .collect();
    let mut tx = store.begin().await.unwrap();
    tx.enqueue_batch(&msgs).await.unwrap();
    tx.commit().await.unwrap();
    let claim = |owner| Claim {
        owner,
        destinations: &d,
        limit: 10,
        lease: Duration::from_secs(30),
    };
    let (n, first) = store.queue().ack_and_claim(&[], &claim("r")).await.unwrap();
    assert_eq!((n, first.len()), (0, 1));
    assert_eq!(first[0].decode::<i32>().unwrap(), 0);
    // Another owner's acknowledgement changes nothing, and the key stays blocked.
    let (n, none) = store
        .queue()
        .ack_and_claim(&[first[0].seq], &claim("other"))
        .await
        .unwrap();
    assert_eq!((n, none.len()), (0, 0));
    let (n, second) = store
        .queue()
        .ack_and_claim(&[first[0].seq], &claim("r"))
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(second.len(), 1, "the key's next row is claimable at once");
    assert_eq!(second[0].decode::<i32>().unwrap(), 1);
    assert_eq!(second[0].attempts, 1);
    let stats = store.admin().stats().await.unwrap();
    assert_eq!((stats.delivered, stats.in_flight, stats.pending), (1, 1, 1));
}
both_backends!(ack_and_claim_tests, ack_and_claim);

// Per-key order while many tasks enqueue concurrently and claimers race; at most one
// message of a key in flight. Randomised over seeds (keys, counts, batch sizes).
async fn per_key_order_under_races(backend: Backend) {
    for seed in 0..3u64 {
        let (store, url) = open(backend).await;
        let other = Store::connect(&url).await.unwrap();
        let mut rng = fastrand::Rng::with_seed(seed);
        let producers = rng.usize(2..5);
        let keys_per_producer = rng.usize(1..6);
        let per_key = rng.usize(3..12);
        let total = producers * keys_per_producer * per_key;
        let d = dests(&["k"]);
        let in_flight = Arc::new(Mutex::new(HashSet::<String>::new()));
        let next = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
        let delivered = Arc::new(std::sync::atomic::AtomicUsize::new(0));

        let mut tasks = Vec::new();
        for p in 0..producers {
            let s = store.clone();
            let batchy = rng.bool();
            tasks.push(tokio::spawn(async move {
                for i in 0..per_key {
                    let msgs: Vec<_> = (0..keys_per_producer)
                        .map(|k| Message::to("k").key(format!("p{p}k{k}")).json(&i).unwrap())
                        .collect();
                    let mut tx = s.begin().await.unwrap();
                    if batchy {
                        tx.enqueue_batch(&msgs).await.unwrap();
                    } else {
                        for m in &msgs {
                            tx.enqueue(m).await.unwrap();
                        }
                    }
                    tx.commit().await.unwrap();
                }
            }));
        }
        // Keyless noise, unordered, must not disturb anything.
        let noise: Vec<_> = (0..20)
            .map(|i| Message::to("k").json(&i).unwrap())
            .collect();
        let mut tx = store.begin().await.unwrap();
        tx.enqueue_batch(&noise).await.unwrap();
        tx.commit().await.unwrap();

        for c in 0..4 {
            let s = if c % 2 == 0 {
                store.clone()
            } else {
                other.clone()
            };
            let (d, in_flight, next, delivered) = (
                d.clone(),
                in_flight.clone(),
                next.clone(),
                delivered.clone(),
            );
            let limit = 1 + (seed as u32 + c) % 5;
            // Half the claimers acknowledge with their next claim, as the relay does.
            let combined = c % 2 == 1;
            tasks.push(tokio::spawn(async move {
                let owner = format!("c{c}");
                let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                let mut acks: Vec<i64> = Vec::new();
                while delivered.load(std::sync::atomic::Ordering::SeqCst) < total + 20 {
                    assert!(tokio::time::Instant::now() < deadline, "did not drain");
                    let got = if combined {
                        let claim = Claim {
                            owner: &owner,
                            destinations: &d,
                            limit,
                            lease: Duration::from_secs(30),
                        };
                        let (n, got) = s.queue().ack_and_claim(&acks, &claim).await.unwrap();
                        assert_eq!(n as usize, acks.len());
                        delivered.fetch_add(acks.len(), std::sync::atomic::Ordering::SeqCst);
                        acks.clear();
                        got
                    } else {
                        claim_n(&s, &owner, &d, limit).await
                    };
                    for e in &got {
                        if let Some(k) = &e.key {
                            assert!(
                                in_flight.lock().unwrap().insert(k.clone()),
                                "two in flight for {k}"
                            );
                            let n: usize = e.decode().unwrap();
                            let mut next = next.lock().unwrap();
                            let expect = next.entry(k.clone()).or_insert(0);
                            assert_eq!(n, *expect, "key {k} out of order");
                            *expect += 1;
                        }
                    }
                    if got.is_empty() {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        continue;
                    }
                    tokio::task::yield_now().await;
                    for e in &got {
                        if let Some(k) = &e.key {
                            in_flight.lock().unwrap().remove(k);
                        }
                    }
                    let seqs: Vec<_> = got.iter().map(|e| e.seq).collect();
                    // Release the keys before acking: another claimer may then see the
                    // row still in flight, never the next one early.
                    if combined {
                        acks = seqs;
                    } else {
                        s.queue().mark_delivered(&owner, &seqs).await.unwrap();
                        delivered.fetch_add(seqs.len(), std::sync::atomic::Ordering::SeqCst);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        {
            let next = next.lock().unwrap();
            assert_eq!(next.len(), producers * keys_per_producer);
            assert!(next.values().all(|n| *n == per_key));
        }
        assert_eq!(
            store.admin().stats().await.unwrap().delivered as usize,
            total + 20
        );
    }
}
both_backends!(per_key_order_tests, per_key_order_under_races);

// An expired lease comes back to the pool; the old owner can no longer ack it.
async fn expired_lease_comes_back(backend: Backend) {
    let (store, _) = open(backend).await;
    let d = dests(&["a"]);
    enqueue_one(&store, &Message::to("a").key("k")).await;
    let got = store
        .queue()
        .claim(&Claim {
            owner: "dead-relay",
            destinations: &d,
            limit: 10,
            lease: Duration::from_millis(50),
        })
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        store.queue().reclaim_expired().await.unwrap(),
        0,
        "lease not yet expired"
    );
    wait_until(
        "the dead relay's lease expires",
        Duration::from_secs(30),
        async || store.queue().reclaim_expired().await.unwrap() == 1,
    )
    .await;
    let again = claim_n(&store, "live-relay", &d, 10).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, got[0].id);
    assert_eq!(again[0].attempts, 2);
    assert_eq!(
        store
            .queue()
            .mark_delivered("dead-relay", &[got[0].seq])
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .queue()
            .mark_delivered("live-relay", &[got[0].seq])
            .await
            .unwrap(),
        1
    );
}
both_backends!(lease_tests, expired_lease_comes_back);

// Retry keeps the error and waits; dead after the budget; re-drive resets.
async fn retry_dead_redrive(backend: Backend) {
    let (store, _) = open(backend).await;
    let d = dests(&["a"]);
    let notice_to = dests(&["orch"]);
    let msg = Message::to("a").key("k").header("reply_to", "orch");
    enqueue_one(&store, &msg).await;
    enqueue_one(&store, &Message::to("a").key("k").json(&"second").unwrap()).await;
    let policy = crate::RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(5), 3);
    let attempts;
    loop {
        let got = claim_n(&store, "r", &d, 10).await;
        if got.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        assert_eq!(got.len(), 1, "the second message of the key waits");
        assert_eq!(got[0].id, msg.id);
        let n = got[0].attempts;
        if policy.exhausted(n) {
            attempts = n;
            let notice = Message::to("orch").json(&"delivery failed").unwrap();
            let n = store
                .queue()
                .dead_letter(
                    "r",
                    &[DeadLetter {
                        seq: got[0].seq,
                        reason: "boom 3".into(),
                        notice: Some(notice),
                    }],
                )
                .await
                .unwrap();
            assert_eq!(n, 1);
            break;
        }
        let delay = if n == 1 {
            Duration::from_secs(3600)
        } else {
            Duration::ZERO
        };
        store
            .queue()
            .retry_later(
                "r",
                &[Retry {
                    seq: got[0].seq,
                    delay,
                    error: format!("boom {n}"),
                    spent: true,
                }],
            )
            .await
            .unwrap();
        if n == 1 {
            // Not due for an hour: nothing claimable, the key's next message waits too.
            assert!(claim_n(&store, "r", &d, 10).await.is_empty());
            // Pull it forward by hand for the test.
            let sql = match store.backend() {
                "sqlite" => {
                    "UPDATE outbox SET available_at = 0 WHERE state = 'pending' AND attempts = 1"
                }
                _ => {
                    "UPDATE outbox SET available_at = now() - interval '1 second' WHERE state = 'pending' AND attempts = 1"
                }
            };
            exec(&store, sql).await;
        }
    }
    assert_eq!(attempts, 3);
    let dead = store.admin().dead_letters(None, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].last_error.as_deref(), Some("boom 3"));
    // The notice was enqueued with the dead letter; the key's next message is free.
    assert_eq!(claim_n(&store, "r", &notice_to, 10).await.len(), 1);
    let next = claim_n(&store, "r", &d, 10).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].decode::<String>().unwrap(), "second");
    store
        .queue()
        .mark_delivered("r", &[next[0].seq])
        .await
        .unwrap();

    store.admin().redrive(msg.id).await.unwrap();
    let back = claim_n(&store, "r", &d, 10).await;
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].attempts, 1, "attempts reset");
    assert!(matches!(
        store.admin().redrive(MessageId::new()).await,
        Err(Error::NotFound { .. })
    ));
}
both_backends!(retry_dead_tests, retry_dead_redrive);

// A transaction that commits late (after rows with higher seq) is still claimed.
async fn late_commit_is_not_skipped(backend: Backend) {
    let (store, _) = open(backend).await;
    let d = dests(&["a"]);
    let mut slow = store.begin().await.unwrap();
    slow.enqueue(&Message::to("a").json(&"slow").unwrap())
        .await
        .unwrap();
    if backend == Backend::Postgres {
        enqueue_one(&store, &Message::to("a").json(&"fast").unwrap()).await;
        let first = claim_n(&store, "r", &d, 10).await;
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].decode::<String>().unwrap(), "fast");
        store
            .queue()
            .mark_delivered("r", &[first[0].seq])
            .await
            .unwrap();
        slow.commit().await.unwrap();
    } else {
        // SQLite has one writer: the second transaction waits for the first, so a
        // later seq never commits first. Check that it waits rather than fails.
        let s2 = store.clone();
        let fast = tokio::spawn(async move {
            enqueue_one(&s2, &Message::to("a").json(&"fast").unwrap()).await;
        });
        // Time for the second writer to reach the lock (and, wrongly, to finish): that
        // something does not happen has no condition to poll for.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!fast.is_finished(), "the second writer should queue");
        slow.commit().await.unwrap();
        fast.await.unwrap();
        let first = claim_n(&store, "r", &d, 1).await;
        assert_eq!(first[0].decode::<String>().unwrap(), "slow");
        store
            .queue()
            .mark_delivered("r", &[first[0].seq])
            .await
            .unwrap();
    }
    let rest = claim_n(&store, "r", &d, 10).await;
    assert_eq!(rest.len(), 1, "the late row must still be claimed");
    assert_eq!(store.admin().stats().await.unwrap().pending, 0);
}
both_backends!(late_commit_tests, late_commit_is_not_skipped);
