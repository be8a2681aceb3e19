//! A hop's writes in one round trip: a caller's statements and messages together, and a
//! hop's deferred last write (its tail on SQLite).

use super::*;

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
        let mut q = crate::drivers::sqlite::statements::Statements::new(
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
    let mix = Mix::new();
    let all: Vec<Message> = [&mix.first, &mix.second, &mix.delayed, &mix.other]
        .into_iter()
        .chain(&mix.more)
        .cloned()
        .collect();
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
    assert_eq!(taken, vec![mix.first.id, mix.more[0].id]);
    assert_eq!(used(), 2);
    let claimed: Vec<MessageId> =
        claim_n(&store, "other-relay", &dests(&["direct", "elsewhere"]), 10)
            .await
            .iter()
            .map(|e| e.id)
            .collect();
    assert_eq!(
        claimed,
        vec![mix.other.id, mix.more[1].id, mix.more[2].id],
        "the second of key k waits"
    );
    let stats = store.admin().stats().await.unwrap();
    assert_eq!((stats.pending, stats.in_flight), (2, 5));

    // A statement that fails: an error, the slots given back, nothing written.
    *fake.used.lock().unwrap() = 0;
    let mut tx = store.begin().await.unwrap();
    let failing =
        crate::drivers::sqlite::statements::Statements::new("INSERT INTO no_such_table VALUES (1)");
    let late = Message::to("direct").json(&9).unwrap();
    let failed = tx.enqueue_batch_after(failing, &[late]).await;
    assert!(failed.is_err());
    assert_eq!(used(), 0);
    drop(tx);
    assert_eq!(store.admin().stats().await.unwrap().pending, 2);
}
both_backends!(enqueue_after_tests, statements_then_messages);

// A hop's last write deferred (`Hop::defer_next_write`, then `enqueue_batch_after`) runs
// in the round trip that ends the hop on SQLite: written with the hop, handed over on
// commit. A deferred write that fails undoes its hop alone (its commit fails, its
// handover slots come back): the hop before and after it are kept, also when the
// failing one is the first of its shared transaction. A lone hop's deferred write runs
// before the commit. On PostgreSQL (no lane) nothing is deferred and the same holds.
async fn deferred_last_writes(backend: Backend) {
    let (store, _) = open(backend).await;
    let fake = FakeHandover::installed(&store, 100, Duration::from_secs(30));
    let marker = |id: MessageId, ok: bool| {
        let mut q = crate::drivers::sqlite::statements::Statements::new(if ok {
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
