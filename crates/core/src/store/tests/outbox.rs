//! The outbox and the inbox in the caller's transaction: commit and rollback, ids and
//! batches, bad input, the inbox's duplicates, backpressure, errors the commit must
//! report, transient errors.

use super::*;
use crate::Sql;

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
    // The same statements on each backend's own sqlx transaction (of different types).
    macro_rules! own_transaction {
        ($pool:expr) => {{
            let mut tx = $pool.begin().await.unwrap();
            sqlx::query("CREATE TABLE orders (id INTEGER)")
                .execute(&mut *tx)
                .await
                .unwrap();
            store.enqueue(&mut *tx, &msg).await.unwrap();
            store.commit(tx).await.unwrap();
        }};
    }
    match store.backend_ref() {
        #[cfg(feature = "sqlite")]
        Db::Sqlite(db) => own_transaction!(db.writer),
        #[cfg(feature = "postgres")]
        Db::Postgres(db) => own_transaction!(db.pool),
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
    let prune = async |age| store.admin().prune_inbox(age).await.unwrap();
    super::admin::prunes_by_age(prune, 2).await;
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
        let failed = match tx.conn().0 {
            #[cfg(feature = "sqlite")]
            crate::drivers::ConnOf::Sqlite(c) => sqlx::query("SELECT * FROM no_such_table")
                .execute(c)
                .await
                .is_err(),
            #[cfg(feature = "postgres")]
            crate::drivers::ConnOf::Postgres(c) => {
                sqlx::query("SELECT 1/0").execute(c).await.is_err()
            }
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
    match tx.conn().0 {
        #[cfg(feature = "sqlite")]
        crate::drivers::ConnOf::Sqlite(c) => {
            sqlx::query("SELECT 1").execute(c).await.unwrap();
        }
        #[cfg(feature = "postgres")]
        crate::drivers::ConnOf::Postgres(c) => {
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

// A database that says "try again" is not a business failure: a lock timeout, a
// statement timeout, a deadlock and a serialization failure are transient.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_statement_timeouts_are_transient() {
    let (_store, url) = open(Backend::Postgres).await;
    use sqlx::Connection;
    async fn run(c: &mut sqlx::PgConnection, sql: &'static str) {
        sqlx::query(sql).execute(c).await.unwrap();
    }
    async fn fails(c: &mut sqlx::PgConnection, sql: &'static str) -> Error {
        Error::from(sqlx::query(sql).execute(c).await.unwrap_err())
    }
    let mut a = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut b = sqlx::PgConnection::connect(&url).await.unwrap();
    run(&mut a, "CREATE TABLE t (id INT PRIMARY KEY)").await;
    run(&mut a, "INSERT INTO t VALUES (1)").await;
    let mut held = a.begin().await.unwrap();
    run(&mut held, "SELECT * FROM t WHERE id = 1 FOR UPDATE").await;
    run(&mut b, "SET lock_timeout = '50ms'").await;
    let locked = fails(&mut b, "SELECT * FROM t WHERE id = 1 FOR UPDATE").await;
    assert!(locked.is_transient(), "lock_timeout: {locked}");
    held.rollback().await.unwrap();
    run(&mut b, "SET statement_timeout = '20ms'").await;
    let slow = fails(&mut b, "SELECT pg_sleep(1)").await;
    assert!(slow.is_transient(), "statement_timeout: {slow}");
    // Not everything is: a constraint violated by the caller stays a failure.
    assert!(
        !fails(&mut a, "INSERT INTO t VALUES (1)")
            .await
            .is_transient()
    );
}

// A delay counts from when the message is written, not from when its transaction
// began: a transaction that waited 300 ms before it enqueued a message delayed 1 s
// makes it available 1 s after the enqueue, not 700 ms after (a durable sleep must not
// wake early). Also for a batch.
async fn a_delay_counts_from_the_write(backend: Backend) {
    let (store, _) = open(backend).await;
    let mut tx = store.begin().await.unwrap();
    Sql::new("SELECT 1 AS one")
        .fetch_one(tx.conn())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let written = crate::clock::system_now_ms();
    let one = Message::to("a").delay(Duration::from_secs(1));
    tx.enqueue(&one).await.unwrap();
    let batch: Vec<Message> = (0..3)
        .map(|_| Message::to("a").delay(Duration::from_secs(1)))
        .collect();
    tx.enqueue_batch(&batch).await.unwrap();
    tx.commit().await.unwrap();
    let rows = Sql::new("SELECT {ms available_at} AS at FROM outbox")
        .fetch_all(store.reader())
        .await
        .unwrap();
    assert_eq!(rows.len(), 4);
    for r in &rows {
        let at = r.int("at").unwrap();
        assert!(
            at >= written + 1_000 - 5,
            "available {} ms early",
            written + 1_000 - at
        );
    }
}

both_backends!(delay_from_the_write, a_delay_counts_from_the_write);
