//! The store's contract, one body per test, run on SQLite and on PostgreSQL.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::backend::Backend as Db;
use crate::admin::Stats;
use crate::queue::{Claim, DeadLetter, Retry};
use crate::testing::{Backend, fresh_url};
use crate::{Error, Message, MessageId, Receipt, Store, StoreConfig, both_backends};

async fn open(backend: Backend) -> (Store, String) {
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.expect("open store");
    (store, url)
}

fn dests(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

async fn claim_n(store: &Store, owner: &str, d: &[String], limit: u32) -> Vec<crate::Envelope> {
    store
        .queue()
        .claim(&Claim {
            owner,
            destinations: d,
            limit,
            lease: Duration::from_secs(30),
        })
        .await
        .expect("claim")
}

async fn enqueue_one(store: &Store, msg: &Message) {
    let mut tx = store.begin().await.expect("begin");
    tx.enqueue(msg).await.expect("enqueue");
    tx.commit().await.expect("commit");
}

// Rollback ⇒ nothing claimable; commit ⇒ claimable exactly once.
async fn rollback_and_commit(backend: Backend) {
    let (store, _) = open(backend).await;
    let d = dests(&["a"]);
    let mut tx = store.begin().await.unwrap();
    tx.enqueue(&Message::to("a").json(&1).unwrap())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(claim_n(&store, "r", &d, 10).await.is_empty());
    assert_eq!(store.admin().stats().await.unwrap().pending, 0);

    let msg = Message::to("a").json(&serde_json::json!({"n": 2})).unwrap();
    enqueue_one(&store, &msg).await;
    let got = claim_n(&store, "r", &d, 10).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, msg.id);
    assert_eq!(got[0].attempts, 1);
    assert_eq!(got[0].decode::<serde_json::Value>().unwrap()["n"], 2);
    assert!(
        claim_n(&store, "r2", &d, 10).await.is_empty(),
        "claimed twice"
    );
    assert_eq!(
        store
            .queue()
            .mark_delivered("r", &[got[0].seq])
            .await
            .unwrap(),
        1
    );
    assert!(claim_n(&store, "r2", &d, 10).await.is_empty());
}
both_backends!(rollback_and_commit_tests, rollback_and_commit);

// The caller's own sqlx transaction carries the message (the heart of the API).
async fn enqueue_in_callers_own_transaction(backend: Backend) {
    let (store, _) = open(backend).await;
    let msg = Message::to("a").json(&"hello").unwrap();
    // `Store::commit` commits the caller's transaction and wakes the relays.
    let woken = *store.wakeups().subscribe().borrow();
    match store.backend_ref() {
        Db::Sqlite(db) => {
            let mut tx = db.writer.begin().await.unwrap();
            sqlx::query("CREATE TABLE orders (id INTEGER)")
                .execute(&mut *tx)
                .await
                .unwrap();
            store.enqueue(&mut *tx, &msg).await.unwrap();
            store.commit(tx).await.unwrap();
        }
        Db::Postgres(db) => {
            let mut tx = db.pool.begin().await.unwrap();
            sqlx::query("CREATE TABLE orders (id INTEGER)")
                .execute(&mut *tx)
                .await
                .unwrap();
            store.enqueue(&mut *tx, &msg).await.unwrap();
            store.commit(tx).await.unwrap();
        }
    }
    assert!(
        *store.wakeups().subscribe().borrow() > woken,
        "Store::commit wakes the relays"
    );
    let got = claim_n(&store, "r", &dests(&["a"]), 10).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, "\"hello\"");
}
both_backends!(own_transaction_tests, enqueue_in_callers_own_transaction);

// The same id twice is stored once; a batch keeps its order.
async fn idempotent_ids_and_batches(backend: Backend) {
    let (store, _) = open(backend).await;
    let id = MessageId::new();
    let msg = Message::to("a").id(id).json(&1).unwrap();
    enqueue_one(&store, &msg).await;
    enqueue_one(&store, &msg).await;
    let batch: Vec<_> = (0..5)
        .map(|i| Message::to("b").key("k").json(&i).unwrap())
        .chain([msg.clone()])
        .collect();
    let mut tx = store.begin().await.unwrap();
    tx.enqueue_batch(&batch).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.admin().stats().await.unwrap().pending, 6);
    let mut seen = Vec::new();
    for _ in 0..5 {
        let got = claim_n(&store, "r", &dests(&["b"]), 10).await;
        assert_eq!(got.len(), 1, "one at a time per key");
        seen.push(got[0].decode::<i32>().unwrap());
        store
            .queue()
            .mark_delivered("r", &[got[0].seq])
            .await
            .unwrap();
    }
    assert_eq!(seen, vec![0, 1, 2, 3, 4]);
}
both_backends!(idempotent_tests, idempotent_ids_and_batches);

// Bad input: typed errors, nothing written.
async fn bad_input(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = Store::connect_with(&url, StoreConfig::default().max_message_bytes(100))
        .await
        .unwrap();
    let mut tx = store.begin().await.unwrap();
    assert!(matches!(
        tx.enqueue(&Message::to("  ")).await,
        Err(Error::EmptyDestination)
    ));
    assert!(matches!(
        tx.enqueue(&Message::to("a").json(&"x".repeat(200)).unwrap())
            .await,
        Err(Error::PayloadTooLarge { limit: 100, .. })
    ));
    assert!(matches!(
        tx.enqueue(&Message::to("a").raw_json("{not json")).await,
        Err(Error::Json(_))
    ));
    tx.commit().await.unwrap();
    assert_eq!(store.admin().stats().await.unwrap(), Stats::default());
}
both_backends!(bad_input_tests, bad_input);

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
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(store.queue().reclaim_expired().await.unwrap(), 1);
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

async fn exec(store: &Store, sql: &'static str) {
    let mut tx = store.begin().await.unwrap();
    match tx.conn() {
        crate::Conn::Sqlite(c) => {
            sqlx::query(sql).execute(c).await.unwrap();
        }
        crate::Conn::Postgres(c) => {
            sqlx::query(sql).execute(c).await.unwrap();
        }
    }
    tx.commit().await.unwrap();
}

// The inbox recognises a duplicate, in the caller's transaction.
async fn inbox_duplicate(backend: Backend) {
    let (store, _) = open(backend).await;
    let id = MessageId::new();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(tx.receive("agent", id).await.unwrap(), Receipt::First);
    tx.rollback().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        tx.receive("agent", id).await.unwrap(),
        Receipt::First,
        "rolled back"
    );
    tx.commit().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(tx.receive("agent", id).await.unwrap(), Receipt::Duplicate);
    assert_eq!(tx.receive("other-agent", id).await.unwrap(), Receipt::First);
    tx.commit().await.unwrap();
    assert_eq!(
        store
            .admin()
            .prune_inbox(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        store
            .admin()
            .prune_inbox(Duration::from_millis(1))
            .await
            .unwrap(),
        2
    );
}
both_backends!(inbox_tests, inbox_duplicate);

// Backpressure: past the limit enqueue fails with QueueFull and writes nothing.
async fn backpressure(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = Store::connect_with(&url, StoreConfig::default().max_pending(Some(3)))
        .await
        .unwrap();
    for i in 0..3 {
        enqueue_one(&store, &Message::to("a").json(&i).unwrap()).await;
    }
    let mut tx = store.begin().await.unwrap();
    let err = tx.enqueue(&Message::to("a")).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::QueueFull {
                pending: 3,
                limit: 3
            }
        ),
        "{err}"
    );
    tx.commit().await.unwrap();
    assert_eq!(store.admin().stats().await.unwrap().pending, 3);
    let got = claim_n(&store, "r", &dests(&["a"]), 1).await;
    store
        .queue()
        .mark_delivered("r", &[got[0].seq])
        .await
        .unwrap();
    enqueue_one(&store, &Message::to("a")).await;
}
both_backends!(backpressure_tests, backpressure);

// The limit holds under concurrency: producers whose transactions overlap (each counts,
// then inserts, then commits later) do not all see room and overshoot it together.
async fn backpressure_under_concurrency(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = Store::connect_with(&url, StoreConfig::default().max_pending(Some(10)))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut tx = store.begin().await.unwrap();
            let batch = [
                Message::to("a").json(&i).unwrap(),
                Message::to("a").json(&i).unwrap(),
            ];
            match tx.enqueue_batch(&batch).await {
                Ok(()) => {
                    // Hold the transaction open while the others count.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    tx.commit().await.unwrap();
                    true
                }
                Err(Error::QueueFull { .. }) => {
                    tx.rollback().await.unwrap();
                    false
                }
                Err(e) => panic!("{e}"),
            }
        }));
    }
    let mut accepted = 0;
    for t in tasks {
        accepted += u64::from(t.await.unwrap());
    }
    let pending = store.admin().stats().await.unwrap().pending;
    assert_eq!(pending, accepted * 2);
    assert!(pending <= 10, "{pending} pending over a limit of 10");
    assert_eq!(accepted, 5, "room for five batches of two");
}
both_backends!(
    backpressure_concurrency_tests,
    backpressure_under_concurrency
);

// Prune delivered rows by age; stats count states and report the lag.
async fn prune_and_stats(backend: Backend) {
    let (store, _) = open(backend).await;
    let d = dests(&["a"]);
    for i in 0..3 {
        enqueue_one(&store, &Message::to("a").json(&i).unwrap()).await;
    }
    enqueue_one(&store, &Message::to("a").delay(Duration::from_secs(3600))).await;
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
    assert_eq!(
        store
            .admin()
            .prune_delivered(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        store
            .admin()
            .prune_delivered(Duration::from_millis(1))
            .await
            .unwrap(),
        2
    );
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

// Migrations apply once and reopen cleanly; a newer schema is refused.
async fn migrations(backend: Backend) {
    let (store, url) = open(backend).await;
    enqueue_one(&store, &Message::to("a")).await;
    store.close().await;
    let store = Store::connect(&url).await.expect("reopen");
    assert_eq!(store.admin().stats().await.unwrap().pending, 1);
    let sql = match backend {
        Backend::Sqlite => {
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (99990101000000, 'from the future', 1, x'00', 0)"
        }
        Backend::Postgres => {
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (99990101000000, 'from the future', true, '\\x00', 0)"
        }
    };
    exec(&store, sql).await;
    store.close().await;
    match Store::connect(&url).await {
        Err(Error::SchemaTooNew { found, .. }) => assert_eq!(found, 99990101000000),
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}
both_backends!(migration_tests, migrations);

#[tokio::test]
async fn bad_urls_are_typed_errors() {
    for url in [
        "mysql://x",
        "nonsense",
        "",
        "postgres://127.0.0.1:notaport/x",
    ] {
        match Store::connect(url).await {
            Err(Error::InvalidUrl { reason, .. }) => assert!(!reason.is_empty()),
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }
    let err = Store::connect("sqlite:///nonexistent-dir/deeper/x.db")
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Connect {
                scheme: "sqlite",
                ..
            }
        ),
        "{err}"
    );
    // A closed port on loopback: refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://u@127.0.0.1:{port}/db?connect_timeout=2");
    let config = StoreConfig {
        acquire_timeout: Duration::from_secs(2),
        ..StoreConfig::default()
    };
    let err = Store::connect_with(&url, config).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Connect {
                scheme: "postgres",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("postgres"), "{err}");
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
                    hop.rollback();
                    None
                }
                1 if i % 2 == 1 => {
                    // A failing statement inside the hop, then an attempt to commit
                    // it: this hop alone may fail.
                    hop.enqueue(&Message::to("undone").json(&i).unwrap())
                        .await
                        .unwrap();
                    let bad: Result<u64, sqlx::Error> = crate::with_conn!(hop.conn(), c => {
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
                    Ok(crate::with_conn!(c, c => {
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

/// Awaits `opening` (a hop's), telling `queued` once its first poll has queued it for
/// the lane (on SQLite), so that a test queues hops in the order it means.
async fn after_queueing<F: std::future::Future>(
    opening: F,
    queued: tokio::sync::oneshot::Sender<()>,
) -> F::Output {
    let mut opening = std::pin::pin!(opening);
    let mut queued = Some(queued);
    std::future::poll_fn(|cx| {
        let polled = opening.as_mut().poll(cx);
        if let Some(q) = queued.take() {
            let _ = q.send(());
        }
        polled
    })
    .await
}

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
    let mut tasks = Vec::new();
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
    for (i, (id, keep)) in plan.into_iter().enumerate() {
        let store = store.clone();
        let (queued, is_queued) = tokio::sync::oneshot::channel::<()>();
        tasks.push(tokio::spawn(async move {
            let (mut hop, receipt) = after_queueing(store.hop_receiving("agent", id), queued)
                .await
                .unwrap();
            hop.enqueue(&Message::to("out").json(&(i as u32)).unwrap())
                .await
                .unwrap();
            if keep {
                hop.commit().await.unwrap();
            } else {
                hop.rollback();
            }
            receipt
        }));
        // Queued in plan order: the next task starts after this one has queued.
        is_queued.await.unwrap();
    }
    first.commit().await.unwrap();
    let mut receipts = Vec::new();
    for t in tasks {
        receipts.push(t.await.unwrap());
    }
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
// savepoint and inbox record) gets the rows as the shared transaction stands when it
// opens: with the writes of the hops kept before it, without those of a hop rolled
// back, also when its message is a duplicate. A read that fails fails its hop alone.
// On PostgreSQL nothing is prefetched: the hop reads for itself.
async fn hops_open_with_their_prefetch(backend: Backend) {
    use crate::Prefetch;
    let (store, _) = open(backend).await;
    let count =
        || Prefetch::new("SELECT count(*) AS n FROM outbox WHERE destination = ?").bind("out");
    let ids: Vec<MessageId> = (0..5).map(|_| MessageId::new()).collect();
    {
        let mut tx = store.begin().await.unwrap();
        tx.enqueue(&Message::to("out").json(&0).unwrap())
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    // The first hop holds the lane until every other hop has queued behind it.
    let first = store.hop().await.unwrap();
    // (message, read, keep?) in queue order: ids[0] kept; ids[1] rolled back; ids[2]
    // kept; ids[0] again (a duplicate, dropped; on SQLite opened after the commit);
    // ids[3] with a read that fails; ids[4].
    let plan = [
        (ids[0], count(), true),
        (ids[1], count(), false),
        (ids[2], count(), true),
        (ids[0], count(), true),
        (
            ids[3],
            Prefetch::new("SELECT missing FROM no_such_table"),
            true,
        ),
        (ids[4], count(), true),
    ];
    let mut tasks = Vec::new();
    for (id, read, keep) in plan {
        let store = store.clone();
        let (queued, is_queued) = tokio::sync::oneshot::channel::<()>();
        tasks.push(tokio::spawn(async move {
            let opening = store.hop_receiving_prefetched("agent", id, Some(read));
            let opened = after_queueing(opening, queued).await;
            let (mut hop, receipt, read) = match opened {
                Ok(opened) => opened,
                Err(e) => return Err(e.to_string()),
            };
            let n = read.map(|r| {
                r.rows()
                    .iter()
                    .flatten()
                    .map(|row| row.int("n").unwrap())
                    .collect::<Vec<_>>()
            });
            if receipt == Receipt::First {
                hop.enqueue(&Message::to("out").json(&1).unwrap())
                    .await
                    .unwrap();
                if keep {
                    hop.commit().await.unwrap();
                } else {
                    hop.rollback();
                }
            }
            Ok((receipt, n))
        }));
        is_queued.await.unwrap();
    }
    first.commit().await.unwrap();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    use Receipt::{Duplicate, First};
    if backend == Backend::Sqlite {
        let read = |n: i64| Some(vec![n]);
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
        // Nothing read: a PostgreSQL hop reads for itself (the failing read is never
        // run either).
        for (i, r) in results.iter().enumerate() {
            let (_, n) = r.as_ref().unwrap();
            assert_eq!(*n, None, "hop {i}");
        }
    }
    // ids[0], ids[2] and ids[4] committed their messages (and ids[3] on PostgreSQL,
    // where its read is not run); ids[1]'s was rolled back.
    let expected = if backend == Backend::Sqlite { 4 } else { 5 };
    assert_eq!(store.admin().stats().await.unwrap().pending, expected);
}
both_backends!(hop_prefetch_tests, hops_open_with_their_prefetch);

/// A handover that takes up to `cap` rows of destination "direct" and records what it
/// was given.
/// Messages that test the handover's rules: two keyed rows of one key, a delayed one,
/// another destination, then three more for "direct" (past a cap of 3).
struct Mix {
    first: Message,
    second: Message,
    delayed: Message,
    other: Message,
    more: Vec<Message>,
}

impl Mix {
    fn new() -> Self {
        Self {
            first: Message::to("direct").key("k").json(&1).unwrap(),
            second: Message::to("direct").key("k").json(&2).unwrap(),
            delayed: Message::to("direct")
                .json(&3)
                .unwrap()
                .delay(Duration::from_secs(60)),
            other: Message::to("elsewhere").json(&4).unwrap(),
            more: (5..8)
                .map(|i| Message::to("direct").json(&i).unwrap())
                .collect(),
        }
    }
}

struct FakeHandover {
    cap: usize,
    used: Mutex<usize>,
    taken: Mutex<Vec<crate::Envelope>>,
    lease: Duration,
}

impl FakeHandover {
    /// A fake with `cap` slots, set as `store`'s handover.
    fn installed(store: &Store, cap: usize, lease: Duration) -> Arc<Self> {
        let fake = Arc::new(Self {
            cap,
            used: Mutex::new(0),
            taken: Mutex::new(Vec::new()),
            lease,
        });
        store.set_handover(Arc::clone(&fake) as _);
        fake
    }
}

impl crate::handover::Handover for FakeHandover {
    fn owner(&self) -> &str {
        "fake-relay"
    }
    fn lease(&self) -> Duration {
        self.lease
    }
    fn reserve(&self, destination: &str) -> bool {
        let mut used = self.used.lock().unwrap();
        if destination == "direct" && *used < self.cap {
            *used += 1;
            true
        } else {
            false
        }
    }
    fn cancel(&self, _: &str) {
        *self.used.lock().unwrap() -= 1;
    }
    fn take(&self, rows: Vec<crate::Envelope>) {
        self.taken.lock().unwrap().extend(rows);
    }
}

// A caller's statements and the messages after them, in one round trip on SQLite
// (`Tx::enqueue_batch_after`): the statements run, and the messages are written as
// `enqueue_batch` writes them, direct handover included (a keyed row whose key is live,
// a delayed row, a row past the slots: pending, in order). A failing statement fails
// the call and gives the slots back. A PostgreSQL transaction is refused.
async fn statements_then_messages(backend: Backend) {
    let (store, _) = open(backend).await;
    let fake = FakeHandover::installed(&store, 3, Duration::from_secs(30));
    let used = || *fake.used.lock().unwrap();
    let marker = MessageId::new();
    let before = || {
        let mut q = crate::sqlite::statements::Statements::new(
            "INSERT INTO inbox (consumer, message_id, received_at) VALUES ('before', ",
        );
        q.push_bind(marker).push(", 0)");
        q
    };
    let mut tx = store.begin().await.unwrap();
    if backend == Backend::Postgres {
        let refused = tx
            .enqueue_batch_after(before(), &[Message::to("direct").json(&0).unwrap()])
            .await;
        assert!(
            matches!(refused, Err(Error::BackendMismatch { .. })),
            "{refused:?}"
        );
        assert_eq!(used(), 0);
        return;
    }
    let Mix {
        first,
        second,
        delayed,
        other,
        more,
    } = Mix::new();
    let mut all = vec![
        first.clone(),
        second.clone(),
        delayed.clone(),
        other.clone(),
    ];
    all.extend(more.iter().cloned());
    tx.enqueue_batch_after(before(), &all).await.unwrap();
    assert!(
        fake.taken.lock().unwrap().is_empty(),
        "handed over on commit"
    );
    tx.commit().await.unwrap();
    assert!(
        store.seen("before", marker).await.unwrap(),
        "the statements ran"
    );
    let taken: Vec<MessageId> = fake.taken.lock().unwrap().iter().map(|e| e.id).collect();
    // The slots are reserved before the round trip: the second of key k took one
    // (given back once its key was found live), so more[1] found none.
    assert_eq!(taken, vec![first.id, more[0].id]);
    assert_eq!(used(), 2);
    let claimed: Vec<MessageId> =
        claim_n(&store, "other-relay", &dests(&["direct", "elsewhere"]), 10)
            .await
            .iter()
            .map(|e| e.id)
            .collect();
    assert_eq!(
        claimed,
        vec![other.id, more[1].id, more[2].id],
        "the second of key k waits"
    );
    let stats = store.admin().stats().await.unwrap();
    assert_eq!((stats.pending, stats.in_flight), (2, 5));

    // A statement that fails: an error, the slots given back, nothing written.
    *fake.used.lock().unwrap() = 0;
    let mut tx = store.begin().await.unwrap();
    let failing =
        crate::sqlite::statements::Statements::new("INSERT INTO no_such_table VALUES (1)");
    let late = Message::to("direct").json(&9).unwrap();
    let failed = tx.enqueue_batch_after(failing, &[late]).await;
    assert!(failed.is_err());
    assert_eq!(used(), 0);
    drop(tx);
    assert_eq!(store.admin().stats().await.unwrap().pending, 2);
}
both_backends!(enqueue_after_tests, statements_then_messages);

// A hop's last write deferred (`Tx::defer_next_write`, then `enqueue_batch_after`) runs
// in the round trip that ends the hop on SQLite: written with the hop, handed over on
// commit. A deferred write that fails undoes its hop alone (its commit fails, its
// handover slots come back): the hop before and after it are kept, also when the
// failing one is the first of its shared transaction. A lone hop's deferred write runs
// before the commit. On PostgreSQL (no lane) nothing is deferred and the same holds.
async fn deferred_last_writes(backend: Backend) {
    let (store, _) = open(backend).await;
    let fake = FakeHandover::installed(&store, 100, Duration::from_secs(30));
    let marker = |id: MessageId, ok: bool| {
        let mut q = crate::sqlite::statements::Statements::new(if ok {
            "INSERT INTO inbox (consumer, message_id, received_at) VALUES ('marker', "
        } else {
            "INSERT INTO no_such_table (consumer, message_id, received_at) VALUES ('marker', "
        });
        q.push_bind(id).push(", 0)");
        q
    };
    // Each hop: (ok?), in queue order. The first holds the lane until all queued.
    let plan = [false, true, true, false, true];
    if backend == Backend::Postgres {
        // No lane: a PostgreSQL transaction refuses a SQLite write, deferred or not.
        let mut hop = store.hop().await.unwrap();
        hop.defer_next_write();
        let refused = hop
            .enqueue_batch_after(marker(MessageId::new(), true), &[])
            .await;
        assert!(matches!(refused, Err(Error::BackendMismatch { .. })));
        return;
    }
    let mut tasks = Vec::new();
    let mut ids = Vec::new();
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let mut wait = Some(wait);
    for ok in plan {
        let id = MessageId::new();
        ids.push(id);
        let store = store.clone();
        let (queued, is_queued) = tokio::sync::oneshot::channel::<()>();
        let q = marker(id, ok);
        // The first hop waits for the others to queue behind it.
        let wait = wait.take();
        tasks.push(tokio::spawn(async move {
            let mut hop = after_queueing(store.hop(), queued).await.unwrap();
            if let Some(wait) = wait {
                wait.await.unwrap();
            }
            hop.defer_next_write();
            let m = Message::to("direct").json(&id.to_string()).unwrap();
            hop.enqueue_batch_after(q, std::slice::from_ref(&m))
                .await
                .unwrap();
            (m.id, hop.commit().await)
        }));
        is_queued.await.unwrap();
    }
    go.send(()).unwrap();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    for ((id, ok), (_, committed)) in ids.iter().zip(plan).zip(&results) {
        assert_eq!(committed.is_ok(), ok, "{committed:?}");
        assert_eq!(store.seen("marker", *id).await.unwrap(), ok);
    }
    // The kept hops' messages were handed over, in order; the undone ones' slots are back.
    let kept: Vec<MessageId> = results
        .iter()
        .zip(plan)
        .filter(|(_, ok)| *ok)
        .map(|((m, _), _)| *m)
        .collect();
    let taken: Vec<MessageId> = fake.taken.lock().unwrap().iter().map(|e| e.id).collect();
    assert_eq!(taken, kept);
    assert_eq!(*fake.used.lock().unwrap(), kept.len());
    let stats = store.admin().stats().await.unwrap();
    assert_eq!((stats.pending, stats.in_flight), (0, kept.len() as u64));
    assert!(
        store.hop_stats().commits < store.hop_stats().hops,
        "shared commits"
    );

    // A lone hop: its deferred write runs before the commit.
    let id = MessageId::new();
    let mut hop = store.hop().await.unwrap();
    hop.defer_next_write();
    hop.enqueue_batch_after(
        marker(id, true),
        &[Message::to("elsewhere").json(&1).unwrap()],
    )
    .await
    .unwrap();
    hop.commit().await.unwrap();
    assert!(store.seen("marker", id).await.unwrap());
    assert_eq!(store.admin().stats().await.unwrap().pending, 1);
}
both_backends!(deferred_write_tests, deferred_last_writes);

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
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(store.queue().reclaim_expired().await.unwrap() >= 2);
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
        hop.rollback();
    });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    kept.commit().await.unwrap();
    undone.await.unwrap();
    // `rollback` returns at once; the lane undoes the hop right after.
    for _ in 0..100 {
        if used() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(used(), 0);
    assert_eq!(fake.taken.lock().unwrap().len(), 3);
}
both_backends!(handover_tests, direct_handover);

// SQLite's WAL is checkpointed in the background, off the writer: written to three
// times the writer's own checkpoint threshold, the background checkpointer copied it
// back to the database file, and the WAL stayed bounded (a checkpoint that catches up
// completely lets the next writer start the WAL over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_wal_is_checkpointed_in_the_background() {
    let (store, url) = open(Backend::Sqlite).await;
    let wal = std::path::PathBuf::from(format!("{}-wal", url.trim_start_matches("sqlite://")));
    let page = 4096u64;
    let threshold = u64::from(crate::sqlite::checkpoint::WRITER_PAGES) * page;
    // A message with a payload of ~64 KiB: 16 pages and more per commit.
    let payload = "x".repeat(64 * 1024);
    let mut written = 0u64;
    let mut largest = 0u64;
    while written < 3 * threshold {
        let mut tx = store.begin().await.unwrap();
        tx.enqueue(&Message::to("big").json(&payload).unwrap())
            .await
            .unwrap();
        tx.commit().await.unwrap();
        written += payload.len() as u64;
        largest = largest.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
        tokio::task::yield_now().await;
    }
    let Db::Sqlite(db) = store.backend_ref() else {
        unreachable!("a SQLite store")
    };
    let copied = db.checkpoints.as_ref().expect("a file database").copied();
    assert!(copied > 0, "no background checkpoint copied the WAL back");
    assert!(
        largest < 2 * threshold,
        "the WAL reached {largest} bytes for {written} written: unbounded"
    );
    store.close().await;
}

// SQLite's lane keeps its connection from one shared transaction to the next while
// hops keep coming, but gives it back (within `hop::HOLD`) so that the store's other
// writers are not starved: a `Store::begin` commits while hops are still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_lane_gives_the_writer_to_other_writers() {
    let (store, _) = open(Backend::Sqlite).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hops = {
        let (store, done) = (store.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            // Until the writer below is through (bounded: a lane that never gave the
            // connection back fails the test instead of hanging it).
            let mut n = 0u32;
            while !done.load(std::sync::atomic::Ordering::Acquire) && n < 200_000 {
                let mut hop = store.hop().await.unwrap();
                hop.enqueue(&Message::to("h").json(&n).unwrap())
                    .await
                    .unwrap();
                hop.commit().await.unwrap();
                n += 1;
            }
            n
        })
    };
    // Let the hops get going, then write outside them.
    while store.hop_stats().commits < 10 {
        tokio::task::yield_now().await;
    }
    enqueue_one(&store, &Message::to("outside").json(&1).unwrap()).await;
    done.store(true, std::sync::atomic::Ordering::Release);
    let n = hops.await.unwrap();
    assert!(n < 200_000, "the writer outside waited for all the hops");
    let d = dests(&["outside"]);
    assert_eq!(claim_n(&store, "r", &d, 10).await.len(), 1);
    store.close().await;
}

// The lane begins its transaction without waiting on a tokio worker when another
// connection (another process) holds SQLite's write lock: it waits on sqlx's thread,
// within the busy timeout, and its hops commit once the lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_lane_waits_for_another_writer() {
    use sqlx::Connection;
    let (store, url) = open(Backend::Sqlite).await;
    let mut other = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let hop = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut hop = store.hop().await?;
            hop.enqueue(&Message::to("after").json(&1).unwrap()).await?;
            hop.commit().await
        })
    };
    // The hop is waiting for the lock (bounded: it cannot commit before it is free).
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if hop.is_finished() {
            panic!(
                "a hop ended under another's write lock: {:?}",
                hop.await.unwrap()
            );
        }
    }
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    hop.await.unwrap().unwrap();
    let d = dests(&["after"]);
    assert_eq!(claim_n(&store, "r", &d, 10).await.len(), 1);
    store.close().await;
}

// A lane transaction dropped while open (its lane stopped mid-batch) is rolled back:
// its connection is closed rather than given back to the pool inside a transaction,
// and the store's next writer finds the database as it was.
#[tokio::test]
async fn sqlite_lane_transaction_dropped_open_is_rolled_back() {
    let (store, _) = open(Backend::Sqlite).await;
    let mut t = super::Tx::begin_lane(&store, None).await.unwrap();
    t.enqueue(&Message::to("lost").json(&1).unwrap())
        .await
        .unwrap();
    drop(t);
    enqueue_one(&store, &Message::to("kept").json(&2).unwrap()).await;
    let stats = store.admin().stats().await.unwrap();
    assert_eq!(stats.pending, 1, "{stats:?}");
    let d = dests(&["kept", "lost"]);
    let got = claim_n(&store, "r", &d, 10).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].destination, "kept");
    store.close().await;
}

/// PostgreSQL's set lane: a test table, a prefetch of its rows and a set upsert.
#[cfg(feature = "postgres")]
mod set_lane {
    use super::*;
    use crate::Prefetch;
    use crate::write::{Column, Datum, Kind, Table, Writes};
    use sqlx::Row as _;
    use uuid::Uuid;

    /// Rows `k` of `set_test`, each with the value `'0'`.
    async fn seed_set_test(store: &Store, k: &[Uuid]) {
        let mut tx = store.begin().await.unwrap();
        let crate::Conn::Postgres(c) = tx.conn() else {
            unreachable!()
        };
        sqlx::query("INSERT INTO set_test SELECT u, '0' FROM unnest($1::uuid[]) u")
            .bind(k)
            .execute(c)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }

    static READ: [&str; 1] =
        ["SELECT k AS prefetch_key, v FROM set_test WHERE k = ANY($1) ORDER BY k FOR UPDATE"];
    static WRITE: Table = Table::new(
        "set_test",
        &[Column::new("k", Kind::Id), Column::new("v", Kind::Text)],
        1,
    );

    /// The hop's last write: `row` of `set_test` and a message with `v`, kept as data
    /// by the set lane.
    async fn keep(hop: &mut crate::Hop, row: Vec<Datum>, v: &str) {
        hop.defer_next_write();
        let mut writes = Writes::new();
        writes.upsert(&WRITE, row);
        writes.enqueue(&[Message::to("out").json(&v).unwrap()]);
        hop.write_last(writes).await.unwrap();
    }

    /// `n` keys of the set lane that `of` goes to.
    fn keys_like(of: Uuid, n: usize) -> Vec<Uuid> {
        let lanes = crate::postgres::sets::LANES as u128;
        std::iter::repeat_with(Uuid::now_v7)
            .filter(|k| k.as_u128() % lanes == of.as_u128() % lanes)
            .take(n)
            .collect()
    }

    fn read(key: Uuid) -> Prefetch {
        Prefetch::new("").with_set(key, &READ)
    }

    fn value(read: Option<crate::Prefetched>) -> Option<String> {
        let read = read?;
        let rows = read.rows().first()?;
        rows.first().map(|r| r.text("v").unwrap())
    }

    async fn table_value(store: &Store, key: Uuid) -> String {
        let mut tx = store.begin().await.unwrap();
        let crate::Conn::Postgres(c) = tx.conn() else {
            unreachable!()
        };
        sqlx::query("SELECT v FROM set_test WHERE k = $1")
            .bind(key)
            .fetch_one(c)
            .await
            .unwrap()
            .get("v")
    }

    async fn logged(store: &Store) -> Vec<String> {
        let mut tx = store.begin().await.unwrap();
        let crate::Conn::Postgres(c) = tx.conn() else {
            unreachable!()
        };
        sqlx::query("SELECT what FROM set_log ORDER BY what")
            .fetch_all(c)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get("what"))
            .collect()
    }

    /// What a queued hop does with its turn.
    #[derive(Clone, Copy)]
    enum Do {
        /// Keeps `v` for its key and a message, commits.
        Keep(&'static str),
        /// Keeps `v`, then rolls back.
        Undo(&'static str),
        /// Runs a statement of its own (a row in `set_log`), commits or rolls back.
        Write(&'static str, bool),
        /// Runs a statement of its own that fails, ignores the error and commits.
        Swallow(&'static str),
    }

    /// Queues hops in order behind a hop that holds their lane, then lets it go; each
    /// returns its receipt, what it read, and how its commit went.
    async fn batch(
        store: &Store,
        hold: Uuid,
        plan: Vec<(&'static str, MessageId, Uuid, Do)>,
    ) -> Vec<(Receipt, Option<String>, std::result::Result<(), String>)> {
        let (holder, receipt, _) = store
            .hop_receiving_prefetched("holder", MessageId::new(), Some(read(hold)))
            .await
            .unwrap();
        assert_eq!(receipt, Receipt::First);
        let mut tasks = Vec::new();
        for (consumer, id, key, what) in plan {
            let store = store.clone();
            let (queued, is_queued) = tokio::sync::oneshot::channel::<()>();
            tasks.push(tokio::spawn(async move {
                let opening = store.hop_receiving_prefetched(consumer, id, Some(read(key)));
                let (mut hop, receipt, read) = after_queueing(opening, queued).await.unwrap();
                let seen = value(read);
                if receipt == Receipt::Duplicate {
                    return (receipt, seen, Ok(()));
                }
                let row = |v: &str| vec![Datum::Id(key), Datum::from(v)];
                let ended = match what {
                    Do::Keep(v) | Do::Undo(v) => {
                        keep(&mut hop, row(v), v).await;
                        if matches!(what, Do::Undo(_)) {
                            hop.rollback();
                            Ok(())
                        } else {
                            hop.commit().await.map_err(|e| e.to_string())
                        }
                    }
                    Do::Swallow(what) => {
                        let crate::Conn::Postgres(c) = hop.conn() else {
                            unreachable!()
                        };
                        let failed = sqlx::query("INSERT INTO set_log (what) VALUES ($1)")
                            .bind(what)
                            .execute(c)
                            .await;
                        assert!(failed.is_err(), "{what} is logged already");
                        hop.commit().await.map_err(|e| e.to_string())
                    }
                    Do::Write(what, keep) => {
                        let crate::Conn::Postgres(c) = hop.conn() else {
                            unreachable!()
                        };
                        sqlx::query("INSERT INTO set_log (what) VALUES ($1)")
                            .bind(what)
                            .execute(c)
                            .await
                            .unwrap();
                        if keep {
                            hop.commit().await.map_err(|e| e.to_string())
                        } else {
                            hop.rollback();
                            Ok(())
                        }
                    }
                };
                (receipt, seen, ended)
            }));
            is_queued.await.unwrap();
        }
        holder.commit().await.unwrap();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        results
    }

    // Hops ready at once share a transaction whose statements serve them all: each
    // reads its row as the batch found it, keeps its writes as data (written at the
    // batch's end) or runs statements of its own; a hop that rolls back undoes only
    // itself (its kept rows, its inbox record); a second hop of the same key or
    // message waits for the next batch (and sees the first's writes, or is a
    // duplicate). A hop that rolls back statements it ran without a savepoint fails
    // its batch (retried by its callers; the hops not yet run get a batch of their
    // own), and its consumer's hops get savepoints from then on: then it undoes only
    // itself.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hops_share_statements_and_roll_back_alone() {
        let (store, _) = open(Backend::Postgres).await;
        exec(
            &store,
            "CREATE TABLE set_test (k UUID PRIMARY KEY, v TEXT NOT NULL)",
        )
        .await;
        exec(&store, "CREATE TABLE set_log (what TEXT PRIMARY KEY)").await;
        let hold = Uuid::now_v7();
        let k = keys_like(hold, 6);
        seed_set_test(&store, &k).await;
        let before = store.hop_stats();
        let ids: Vec<MessageId> = (0..8).map(|_| MessageId::new()).collect();
        let results = batch(
            &store,
            hold,
            vec![
                ("agent", ids[0], k[0], Do::Keep("a")),
                ("agent", ids[1], k[1], Do::Undo("b")),
                ("writer", ids[2], k[2], Do::Write("c", true)),
                ("agent", ids[0], k[3], Do::Keep("dup")),
                ("agent", ids[3], k[0], Do::Keep("a2")),
                ("agent", ids[4], k[4], Do::Keep("e")),
            ],
        )
        .await;
        use Receipt::{Duplicate, First};
        let ok = Ok(());
        assert_eq!(results[0], (First, Some("0".into()), ok.clone()));
        assert_eq!(results[1], (First, Some("0".into()), ok.clone()));
        assert_eq!(results[2], (First, Some("0".into()), ok.clone()));
        assert_eq!(results[3].0, Duplicate, "the same message, next batch");
        assert_eq!(
            results[4],
            (First, Some("a".into()), ok.clone()),
            "the same key waits for the next batch and reads its first hop's write"
        );
        assert_eq!(results[5], (First, Some("0".into()), ok.clone()));
        assert_eq!(table_value(&store, k[0]).await, "a2");
        assert_eq!(table_value(&store, k[1]).await, "0", "rolled back alone");
        assert_eq!(table_value(&store, k[4]).await, "e");
        assert_eq!(logged(&store).await, ["c"]);
        assert!(store.seen("agent", ids[0]).await.unwrap());
        assert!(!store.seen("agent", ids[1]).await.unwrap());
        assert!(store.seen("writer", ids[2]).await.unwrap());
        // a, a2, e (and the holder's none).
        assert_eq!(store.admin().stats().await.unwrap().pending, 3);
        let after = store.hop_stats();
        assert!(
            after.commits - before.commits < after.hops - before.hops,
            "{before:?} {after:?}"
        );

        // `writer2` rolls back a statement it ran without a savepoint: the batch fails
        // (the hop kept before it gets a shared-commit error), the hop after it runs in
        // a batch of its own.
        let results = batch(
            &store,
            hold,
            vec![
                ("agent", ids[5], k[0], Do::Keep("lost")),
                ("writer2", ids[6], k[1], Do::Write("undone", false)),
                ("agent", ids[7], k[5], Do::Keep("f")),
            ],
        )
        .await;
        let failed = results[0].2.as_ref().unwrap_err();
        assert!(failed.contains("shared transaction"), "{failed}");
        assert_eq!(results[2], (First, Some("0".into()), ok.clone()));
        assert_eq!(
            table_value(&store, k[0]).await,
            "a2",
            "the failed batch wrote nothing"
        );
        assert_eq!(table_value(&store, k[5]).await, "f");
        assert!(!store.seen("agent", ids[5]).await.unwrap());
        assert!(!store.seen("writer2", ids[6]).await.unwrap());

        // Now `writer2`'s hops run in savepoints: its rollback undoes only itself.
        let more: Vec<MessageId> = (0..3).map(|_| MessageId::new()).collect();
        let results = batch(
            &store,
            hold,
            vec![
                ("agent", more[0], k[0], Do::Keep("g")),
                ("writer2", more[1], k[1], Do::Write("undone again", false)),
                ("writer2", more[2], k[2], Do::Write("kept", true)),
            ],
        )
        .await;
        for r in &results {
            assert_eq!(r.2, ok, "{results:?}");
        }
        assert_eq!(table_value(&store, k[0]).await, "g");
        assert_eq!(logged(&store).await, ["c", "kept"]);
        assert!(!store.seen("writer2", more[1]).await.unwrap());
        assert!(store.seen("writer2", more[2]).await.unwrap());

        // A hop of a consumer without savepoints whose statement fails, its error
        // swallowed, fails the transaction unseen: the batch is not reported committed
        // (PostgreSQL would answer its COMMIT with a rollback).
        let last: Vec<MessageId> = (0..2).map(|_| MessageId::new()).collect();
        let results = batch(
            &store,
            hold,
            vec![
                ("writer2", last[0], k[3], Do::Write("lost too", true)),
                ("writer3", last[1], k[4], Do::Swallow("c")),
            ],
        )
        .await;
        for r in &results {
            let failed = r.2.as_ref().unwrap_err();
            assert!(failed.contains("shared transaction"), "{failed}");
        }
        assert_eq!(logged(&store).await, ["c", "kept"]);
        assert!(!store.seen("writer2", last[0]).await.unwrap());
    }

    // The watchdog: a hop that holds its set lane past `hop_timeout` (its handler
    // never returns, say) fails alone: its batch's session is ended, the hops behind
    // it commit in a batch of their own, nothing of it is written, and its commit,
    // when it comes, fails.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hop_past_its_bound_fails_alone() {
        let url = fresh_url(Backend::Postgres).await;
        let config = StoreConfig::default().hop_timeout(Duration::from_millis(300));
        let store = Store::connect_with(&url, config).await.unwrap();
        exec(
            &store,
            "CREATE TABLE set_test (k UUID PRIMARY KEY, v TEXT NOT NULL)",
        )
        .await;
        let k = keys_like(Uuid::now_v7(), 3);
        seed_set_test(&store, &k).await;
        let row = |key: Uuid, v: &str| vec![Datum::Id(key), Datum::from(v)];
        let stuck_id = MessageId::new();
        let (has_hop, got_hop) = tokio::sync::oneshot::channel::<()>();
        let (wake, woken) = tokio::sync::oneshot::channel::<()>();
        let stuck = {
            let store = store.clone();
            let key = k[0];
            tokio::spawn(async move {
                let (mut hop, receipt, _) = store
                    .hop_receiving_prefetched("agent", stuck_id, Some(read(key)))
                    .await
                    .unwrap();
                assert_eq!(receipt, Receipt::First);
                keep(&mut hop, row(key, "stuck"), "stuck").await;
                has_hop.send(()).unwrap();
                // Holds its hop until the test is done with the others.
                woken.await.unwrap();
                hop.commit().await
            })
        };
        got_hop.await.unwrap();
        let mut others = Vec::new();
        for (key, v) in [(k[1], "a"), (k[2], "b")] {
            let store = store.clone();
            others.push(tokio::spawn(async move {
                let (mut hop, receipt, _) = store
                    .hop_receiving_prefetched("agent", MessageId::new(), Some(read(key)))
                    .await
                    .unwrap();
                assert_eq!(receipt, Receipt::First);
                keep(&mut hop, row(key, v), v).await;
                hop.commit().await
            }));
        }
        for t in others {
            // Bounded: without the watchdog they would wait for the stuck hop.
            let committed = tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("the hops behind a stuck one go on")
                .unwrap();
            committed.unwrap();
        }
        wake.send(()).unwrap();
        let late = stuck.await.unwrap();
        assert!(
            matches!(late, Err(Error::SharedCommit(_))),
            "the stuck hop's commit fails: {late:?}"
        );
        assert_eq!(table_value(&store, k[0]).await, "0");
        assert_eq!(table_value(&store, k[1]).await, "a");
        assert_eq!(table_value(&store, k[2]).await, "b");
        assert!(!store.seen("agent", stuck_id).await.unwrap());
        assert_eq!(store.admin().stats().await.unwrap().pending, 2);
    }
}

// A statement of the caller's fails in the transaction and its error is swallowed. On
// PostgreSQL that aborts the transaction and its COMMIT is answered ROLLBACK: the commit
// must report it (`Error::RolledBack`), and nothing of it may be handed over. On SQLite
// a failed statement leaves the transaction alive: the commit keeps the rest. Either
// way the commit's answer tells the truth about what is stored.
async fn a_swallowed_error_is_not_reported_committed(backend: Backend) {
    let (store, _) = open(backend).await;
    let fake = FakeHandover::installed(&store, 10, Duration::from_secs(30));
    for via_handover in [true, false] {
        let dest = if via_handover { "direct" } else { "claimed" };
        let m = Message::to(dest).json(&1).unwrap();
        let mut tx = store.begin().await.unwrap();
        tx.enqueue(&m).await.unwrap();
        let failed = match tx.conn() {
            #[cfg(feature = "sqlite")]
            super::Conn::Sqlite(c) => sqlx::query("SELECT * FROM no_such_table")
                .execute(c)
                .await
                .is_err(),
            #[cfg(feature = "postgres")]
            super::Conn::Postgres(c) => sqlx::query("SELECT 1/0").execute(c).await.is_err(),
        };
        assert!(failed, "the caller's statement fails");
        let committed = tx.commit().await;
        let rows = count_rows(&store, m.id).await;
        match backend {
            Backend::Postgres => {
                assert!(
                    matches!(committed, Err(Error::RolledBack)),
                    "{committed:?} (PostgreSQL rolled it back)"
                );
                assert_eq!(rows, 0, "nothing of it is stored");
                assert!(fake.taken.lock().unwrap().is_empty(), "nothing handed over");
            }
            Backend::Sqlite => {
                committed.unwrap();
                assert_eq!(rows, 1, "the rest of it is stored");
            }
        }
    }
    // The slots of the rolled-back rows came back; a clean transaction still commits,
    // probed or not.
    if matches!(backend, Backend::Postgres) {
        assert_eq!(*fake.used.lock().unwrap(), 0);
    }
    let m = Message::to("direct").json(&2).unwrap();
    let mut tx = store.begin().await.unwrap();
    tx.enqueue(&m).await.unwrap();
    match tx.conn() {
        #[cfg(feature = "sqlite")]
        super::Conn::Sqlite(c) => {
            sqlx::query("SELECT 1").execute(c).await.unwrap();
        }
        #[cfg(feature = "postgres")]
        super::Conn::Postgres(c) => {
            sqlx::query("SELECT 1").execute(c).await.unwrap();
        }
    }
    tx.commit().await.unwrap();
    assert_eq!(count_rows(&store, m.id).await, 1);
    assert!(fake.taken.lock().unwrap().iter().any(|e| e.id == m.id));
}
both_backends!(
    swallowed_error_tests,
    a_swallowed_error_is_not_reported_committed
);

async fn count_rows(store: &Store, id: MessageId) -> i64 {
    match store.backend_ref() {
        #[cfg(feature = "sqlite")]
        Db::Sqlite(db) => sqlx::query_scalar("SELECT count(*) FROM outbox WHERE id = ?")
            .bind(id)
            .fetch_one(&db.reader)
            .await
            .unwrap(),
        #[cfg(feature = "postgres")]
        Db::Postgres(db) => sqlx::query_scalar("SELECT count(*) FROM outbox WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap(),
    }
}

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

// A database that says "try again" is not a business failure: a lock timeout, a
// statement timeout, a deadlock and a serialization failure are transient.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_statement_timeouts_are_transient() {
    let (_store, url) = open(Backend::Postgres).await;
    use sqlx::Connection;
    let mut a = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut b = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("CREATE TABLE t (id INT PRIMARY KEY)")
        .execute(&mut a)
        .await
        .unwrap();
    sqlx::query("INSERT INTO t VALUES (1)")
        .execute(&mut a)
        .await
        .unwrap();
    let mut held = a.begin().await.unwrap();
    sqlx::query("SELECT * FROM t WHERE id = 1 FOR UPDATE")
        .execute(&mut *held)
        .await
        .unwrap();
    sqlx::query("SET lock_timeout = '50ms'")
        .execute(&mut b)
        .await
        .unwrap();
    let locked = sqlx::query("SELECT * FROM t WHERE id = 1 FOR UPDATE")
        .execute(&mut b)
        .await
        .unwrap_err();
    let locked = Error::from(locked);
    assert!(locked.is_transient(), "lock_timeout: {locked}");
    held.rollback().await.unwrap();
    sqlx::query("SET statement_timeout = '20ms'")
        .execute(&mut b)
        .await
        .unwrap();
    let slow = sqlx::query("SELECT pg_sleep(1)")
        .execute(&mut b)
        .await
        .unwrap_err();
    let slow = Error::from(slow);
    assert!(slow.is_transient(), "statement_timeout: {slow}");
    // Not everything is: a constraint violated by the caller stays a failure.
    let dup = sqlx::query("INSERT INTO t VALUES (1)")
        .execute(&mut a)
        .await
        .unwrap_err();
    assert!(!Error::from(dup).is_transient());
}

/// Creates `parent` and `child`, whose foreign key is checked at commit: a hop that
/// inserts a `child` row without its parent fails the commit of its transaction (on
/// SQLite, the shared one) with no error before.
async fn commit_poison_tables(store: &Store) {
    let mut tx = store.begin().await.unwrap();
    for sql in [
        "CREATE TABLE parent (id INTEGER PRIMARY KEY)",
        "CREATE TABLE child (p INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)",
    ] {
        crate::with_conn!(tx.conn(), c => { sqlx::query(sql).execute(c).await.unwrap().rows_affected() });
    }
    tx.commit().await.unwrap();
}

/// Inserts an orphan `child` row in `tx`: its commit will fail.
async fn poison_commit(tx: &mut super::Tx) {
    crate::with_conn!(tx.conn(), c => {
        sqlx::query("INSERT INTO child (p) VALUES (1)").execute(c).await.unwrap().rows_affected()
    });
}

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
            Ok(crate::with_conn!(c, c => {
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

// The watchdog on SQLite: a hop that holds the lane past `hop_timeout` holds the single
// writer, which the lane cannot take back; when it returns it is undone alone (its
// commit fails, nothing of it written) and the hops queued behind it commit.
#[tokio::test]
async fn sqlite_lane_undoes_a_hop_back_past_its_bound() {
    let url = fresh_url(Backend::Sqlite).await;
    let config = StoreConfig::default().hop_timeout(Duration::from_millis(300));
    let store = Store::connect_with(&url, config).await.unwrap();
    let stuck_id = MessageId::new();
    let (mut stuck, _) = store.hop_receiving("agent", stuck_id).await.unwrap();
    stuck
        .enqueue(&Message::to("stuck").json(&0).unwrap())
        .await
        .unwrap();
    let mut others = Vec::new();
    for i in 0..3u32 {
        let store = store.clone();
        let (queued, is_queued) = tokio::sync::oneshot::channel::<()>();
        others.push(tokio::spawn(async move {
            let (mut hop, _) =
                after_queueing(store.hop_receiving("agent", MessageId::new()), queued)
                    .await
                    .unwrap();
            hop.enqueue(&Message::to("kept").json(&i).unwrap())
                .await
                .unwrap();
            hop.commit().await
        }));
        is_queued.await.unwrap();
    }
    // Past the bound (a wait, not a measurement: the lane has let the bound pass).
    tokio::time::sleep(Duration::from_millis(900)).await;
    let late = stuck.commit().await;
    assert!(
        matches!(late, Err(Error::SharedCommit(_))),
        "a hop back past its bound is undone: {late:?}"
    );
    for t in others {
        t.await.unwrap().unwrap();
    }
    assert!(!store.seen("agent", stuck_id).await.unwrap());
    let d = dests(&["kept", "stuck"]);
    let got = claim_n(&store, "r", &d, 10).await;
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|e| e.destination == "kept"));
}
