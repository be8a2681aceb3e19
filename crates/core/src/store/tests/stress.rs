//! SQLite's lane under load: its session (the connection locked away from sqlx's thread,
//! its statements run on it directly, see `sqlite::direct`) taken, used and given back
//! by many hops at once.

use super::*;

/// What a hop of [`sqlite_lane_session_under_load`] left: its marker's id, whether the
/// marker must be there, and how many `pulse` messages it committed.
type Outcome = (MessageId, bool, u64);

/// An inbox row of consumer `stress` for `id` (twice: a primary key violation), or
/// one into a table that does not exist.
fn marker(id: MessageId, how: &str) -> crate::drivers::sqlite::statements::Statements {
    let sql = match how {
        "bad" => "INSERT INTO no_such_table (consumer, message_id, received_at) VALUES ('stress', ",
        _ => "INSERT INTO inbox (consumer, message_id, received_at) VALUES ('stress', ",
    };
    let mut q = crate::drivers::sqlite::statements::Statements::new(sql);
    q.push_bind(id).push(", 0)");
    if how == "twice" {
        q.end_statement()
            .push("INSERT INTO inbox (consumer, message_id, received_at) VALUES ('stress', ")
            .push_bind(id)
            .push(", 0)");
    }
    q
}

fn pulse(id: MessageId) -> Message {
    Message::to("pulse").json(&id.to_string()).unwrap()
}

/// A marker written through sqlx on the hop's connection (which gives the lane's lock
/// back to sqlx's thread).
async fn sqlx_marker(hop: &mut crate::store::Hop, id: MessageId) -> Result<u64, sqlx::Error> {
    let Some(c) = hop.conn().into_sqlite() else {
        unreachable!("a SQLite store")
    };
    sqlx::query("INSERT INTO inbox (consumer, message_id, received_at) VALUES ('stress', ?, 0)")
        .bind(id.to_string())
        .execute(c)
        .await
        .map(|r| r.rows_affected())
}

/// One hop of task `t`, the `i`th, of the kind `(t + i) % 8`.
async fn one_hop(store: &Store, t: u32, i: u32) -> Outcome {
    let id = MessageId::new();
    match (t + i) % 8 {
        // A deferred last write: the marker and a message, run with the hop's end.
        0 => {
            let mut hop = store.hop().await.unwrap();
            hop.defer_next_write();
            hop.enqueue_batch_after(marker(id, "once"), &[pulse(id)])
                .await
                .unwrap();
            let ok = hop.commit().await.is_ok();
            (id, ok, u64::from(ok))
        }
        // The inbox record in the hop's opening, a message, a commit; then the same
        // message again: a duplicate, whose hop is rolled back.
        1 => {
            let (mut hop, receipt) = store.hop_receiving("stress", id).await.unwrap();
            assert_eq!(receipt, Receipt::First);
            hop.enqueue(&pulse(id)).await.unwrap();
            let ok = hop.commit().await.is_ok();
            if ok {
                let (again, receipt) = store.hop_receiving("stress", id).await.unwrap();
                assert_eq!(receipt, Receipt::Duplicate);
                again.rollback().await.expect("rollback");
            }
            (id, ok, u64::from(ok))
        }
        // A primary key violation in the middle of statements run on the session:
        // the call fails with SQLite's code, the hop is rolled back.
        2 => {
            let mut hop = store.hop().await.unwrap();
            let failed = hop
                .enqueue_batch_after(marker(id, "twice"), &[pulse(id)])
                .await
                .unwrap_err();
            let Error::Database(sqlx::Error::Database(db)) = &failed else {
                panic!("not SQLite's error: {failed:?}");
            };
            assert!(db.is_unique_violation(), "{failed:?}");
            assert_eq!(db.code().as_deref(), Some("1555"), "{failed:?}");
            hop.rollback().await.expect("rollback");
            (id, false, 0)
        }
        // A statement through sqlx (the session given back), then the session again,
        // then a rollback.
        3 => {
            let mut hop = store.hop().await.unwrap();
            assert_eq!(sqlx_marker(&mut hop, id).await.unwrap(), 1);
            hop.enqueue_batch_after(
                crate::drivers::sqlite::statements::Statements::new("SELECT 1"),
                &[pulse(id)],
            )
            .await
            .unwrap();
            hop.rollback().await.expect("rollback");
            (id, false, 0)
        }
        // A primary key violation through sqlx, then the session again, then a
        // commit: the hop is kept (SQLite undoes the failed statement alone).
        4 => {
            let mut hop = store.hop().await.unwrap();
            assert_eq!(sqlx_marker(&mut hop, id).await.unwrap(), 1);
            let again = sqlx_marker(&mut hop, id).await.unwrap_err();
            assert!(
                again
                    .as_database_error()
                    .is_some_and(|e| e.is_unique_violation()),
                "{again:?}"
            );
            hop.enqueue(&pulse(id)).await.unwrap();
            let ok = hop.commit().await.is_ok();
            (id, ok, u64::from(ok))
        }
        // A deferred last write that fails: the hop's commit fails, it alone undone.
        5 => {
            let mut hop = store.hop().await.unwrap();
            hop.enqueue(&pulse(id)).await.unwrap();
            hop.defer_next_write();
            hop.enqueue_batch_after(marker(id, "bad"), &[pulse(id)])
                .await
                .unwrap();
            assert!(hop.commit().await.is_err(), "a failed deferred write");
            (id, false, 0)
        }
        // A statement through sqlx (the session given back), then statements on the
        // session cancelled at their first wait (the lock being taken, say), then the
        // hop dropped: undone, and the lane goes on.
        6 => {
            let mut hop = store.hop().await.unwrap();
            assert_eq!(sqlx_marker(&mut hop, id).await.unwrap(), 1);
            let messages = [pulse(id)];
            let write = hop.enqueue_batch_after(marker(id, "once"), &messages);
            let _ = tokio::time::timeout(Duration::ZERO, write).await;
            drop(hop);
            (id, false, 0)
        }
        // A hop dropped with its statements run: undone like a rollback.
        _ => {
            let mut hop = store.hop().await.unwrap();
            hop.enqueue_batch_after(marker(id, "once"), &[pulse(id)])
                .await
                .unwrap();
            drop(hop);
            (id, false, 0)
        }
    }
}

// Many hops at once on one SQLite store, each of one of several kinds interleaved
// (commits, rollbacks, a hop dropped, a hop cancelled while it waits, constraint
// violations on the session and through sqlx, failing deferred writes, inbox records and
// duplicates), while a relay acks and
// claims through the lane: every committed hop's rows are there, no undone one's, and
// every committed message is claimed and acked once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_lane_session_under_load() {
    const TASKS: u32 = 16;
    const HOPS: u32 = 250;
    let (store, _) = open(Backend::Sqlite).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let relay = {
        let (store, done) = (store.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            let d = dests(&["pulse"]);
            let claim = Claim {
                owner: "stress-relay",
                destinations: &d,
                limit: 16,
                lease: Duration::from_secs(600),
            };
            let (mut acked, mut held) = (0u64, Vec::<i64>::new());
            let mut seen = HashSet::new();
            loop {
                let last = done.load(std::sync::atomic::Ordering::Acquire);
                let (n, rows) = store.queue().ack_and_claim(&held, &claim).await.unwrap();
                acked += n;
                held = rows.iter().map(|e| e.seq).collect();
                for e in &rows {
                    assert!(seen.insert(e.id), "claimed twice: {}", e.id);
                }
                if last && held.is_empty() {
                    return acked;
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut out = Vec::new();
                for i in 0..HOPS {
                    out.push(one_hop(&store, t, i).await);
                }
                out
            })
        })
        .collect();
    let run = async {
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        (all, relay.await.unwrap())
    };
    let (all, acked) = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the hops and the relay ended");
    assert_eq!(all.len(), (TASKS * HOPS) as usize);
    let mut kept = 0;
    for (id, there, _) in &all {
        assert_eq!(store.seen("stress", *id).await.unwrap(), *there, "{id}");
        kept += u64::from(*there);
    }
    assert!(kept > u64::from(TASKS * HOPS) / 3, "{kept} hops kept");
    let pulses: u64 = all.iter().map(|(_, _, n)| n).sum();
    assert_eq!(acked, pulses, "every committed message acked once");
    let stats = store.admin().stats().await.unwrap();
    assert_eq!((stats.pending, stats.in_flight), (0, 0));
    assert!(
        store.hop_stats().commits < store.hop_stats().hops,
        "shared commits"
    );
    store.close().await;
}
