//! SQLite's driver: the WAL checkpointed in the background, the lane and its writer,
//! the lane's watchdog.

use super::*;

// SQLite's WAL is checkpointed in the background, off the writer: written to three
// times the writer's own checkpoint threshold, the background checkpointer copied it
// back to the database file, and the WAL stayed bounded (a checkpoint that catches up
// completely lets the next writer start the WAL over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_wal_is_checkpointed_in_the_background() {
    let (store, url) = open(Backend::Sqlite).await;
    let wal = std::path::PathBuf::from(format!("{}-wal", url.trim_start_matches("sqlite://")));
    let page = 4096u64;
    let threshold = u64::from(crate::drivers::sqlite::checkpoint::WRITER_PAGES) * page;
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
// writers (the relay's statements outside hops) are not starved: a transaction of its
// own commits while hops are still running. (A `Store::begin` would join them.)
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
    let mut outside = crate::Tx::begin(&store).await.unwrap();
    outside
        .enqueue(&Message::to("outside").json(&1).unwrap())
        .await
        .unwrap();
    outside.commit().await.unwrap();
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
    let mut t = crate::Tx::begin_lane(&store, None).await.unwrap();
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

// The watchdog on SQLite: a hop that holds the lane past `hop_timeout` holds the single
// writer, which the lane cannot take back; when it returns it is undone alone (its
// commit fails, nothing of it written) and the hops queued behind it commit.
#[tokio::test]
async fn sqlite_lane_undoes_a_hop_back_past_its_bound() {
    let store = open_bounded(Backend::Sqlite).await;
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
