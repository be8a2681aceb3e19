//! PostgreSQL's set lane: a test table, a prefetch of its rows and a set upsert.

use super::*;
use crate::read::Prefetch;
use crate::write::{Column, Datum, Kind, Table, Writes};
use sqlx::Row as _;
use uuid::Uuid;

/// Rows `k` of `set_test`, each with the value `'0'`.
async fn seed_set_test(store: &Store, k: &[Uuid]) {
    let mut tx = store.begin().await.unwrap();
    let Some(c) = tx.conn().into_postgres() else {
        unreachable!()
    };
    sqlx::query("INSERT INTO set_test SELECT u, '0' FROM unnest($1::uuid[]) u")
        .bind(k)
        .execute(c)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

static WRITE: Table = Table::new(
    "set_test",
    &[Column::new("k", Kind::Id), Column::new("v", Kind::Text)],
    1,
);
/// `set_test`'s children, which no test writes: the load reads none.
static CHILDREN: Table = Table::new(
    "set_child",
    &[Column::new("k", Kind::Id), Column::new("i", Kind::Int)],
    2,
);
static READ: crate::read::Load = crate::read::Load::new(&WRITE, &["v"], &CHILDREN, &["i"]);
const SET_CHILD: &str = "CREATE TABLE set_child (k UUID, i INTEGER, PRIMARY KEY (k, i))";

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
    let lanes = crate::drivers::postgres::sets::LANES as u128;
    std::iter::repeat_with(Uuid::now_v7)
        .filter(|k| k.as_u128() % lanes == of.as_u128() % lanes)
        .take(n)
        .collect()
}

fn read(key: Uuid) -> Prefetch {
    Prefetch::load(&READ, key)
}

fn value(read: Option<crate::read::Prefetched>) -> Option<String> {
    read?.loaded().map(|l| l.parent.text("v").unwrap())
}

async fn table_value(store: &Store, key: Uuid) -> String {
    let mut tx = store.begin().await.unwrap();
    let Some(c) = tx.conn().into_postgres() else {
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
    let Some(c) = tx.conn().into_postgres() else {
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
                        hop.rollback().await.expect("rollback");
                        Ok(())
                    } else {
                        hop.commit().await.map_err(|e| e.to_string())
                    }
                }
                Do::Swallow(what) => {
                    let Some(c) = hop.conn().into_postgres() else {
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
                    let Some(c) = hop.conn().into_postgres() else {
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
                        hop.rollback().await.expect("rollback");
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
    exec(&store, SET_CHILD).await;
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
    let store = open_bounded(Backend::Postgres).await;
    exec(
        &store,
        "CREATE TABLE set_test (k UUID PRIMARY KEY, v TEXT NOT NULL)",
    )
    .await;
    exec(&store, SET_CHILD).await;
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
