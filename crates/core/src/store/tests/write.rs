//! Writes as data: rows of declared tables and messages handed to the transaction in
//! one call, rendered by each driver.

use super::*;
use crate::write::{Column, Datum, Kind, Table, Writes};

static A: Table = Table::new(
    "w_a",
    &[
        Column::new("id", Kind::Id),
        Column::new("n", Kind::Int),
        Column::new("at", Kind::Stamp).first(),
    ],
    1,
);
static B: Table = Table::new(
    "w_b",
    &[
        Column::new("a", Kind::Id),
        Column::new("k", Kind::Int),
        Column::new("doc", Kind::Json),
        Column::new("t", Kind::Time).kept(),
    ],
    2,
);
static C: Table = Table::new(
    "w_c",
    &[
        Column::new("id", Kind::Text),
        Column::new("flag", Kind::Bool),
    ],
    1,
);

async fn count(store: &Store, sql: &'static str) -> i64 {
    let mut tx = store.begin().await.unwrap();
    let n: i64 = with_conn!(tx.conn(), c => {
        sqlx::query_scalar(sql).fetch_one(c).await.unwrap()
    });
    tx.rollback().await.unwrap();
    n
}

// Three tables and a message in one write (on PostgreSQL one statement: a foreign key
// between them holds), upserts as each column declares (a later row of a key stands, a
// kept column stays, a first-kept one keeps its first value), an insert of a stored
// key refused, a row that does not fit its table refused before anything is written.
async fn rows_written_as_data(backend: Backend) {
    let (store, _) = open(backend).await;
    let ddl: [&'static str; 3] = match backend {
        Backend::Sqlite => [
            "CREATE TABLE w_a (id TEXT PRIMARY KEY, n INTEGER NOT NULL, at INTEGER)",
            "CREATE TABLE w_b (a TEXT NOT NULL REFERENCES w_a (id), k INTEGER NOT NULL,
                doc TEXT, t INTEGER, PRIMARY KEY (a, k))",
            "CREATE TABLE w_c (id TEXT PRIMARY KEY, flag INTEGER)",
        ],
        Backend::Postgres => [
            "CREATE TABLE w_a (id uuid PRIMARY KEY, n int4 NOT NULL, at timestamptz)",
            "CREATE TABLE w_b (a uuid NOT NULL REFERENCES w_a (id), k int4 NOT NULL,
                doc jsonb, t timestamptz, PRIMARY KEY (a, k))",
            "CREATE TABLE w_c (id text PRIMARY KEY, flag bool)",
        ],
    };
    for sql in ddl {
        exec(&store, sql).await;
    }
    let id = uuid::Uuid::now_v7();
    let mut w = Writes::new();
    w.upsert(&A, vec![Datum::Id(id), Datum::from(1), Datum::Now(1_000)]);
    w.upsert(
        &B,
        vec![
            Datum::Id(id),
            Datum::from(0),
            Datum::from("{\"x\":1}"),
            Datum::Int(5_000),
        ],
    );
    w.upsert(&C, vec![Datum::from("c"), Datum::from(true)]);
    w.upsert(&A, vec![Datum::Id(id), Datum::from(2), Datum::Now(2_000)]);
    w.enqueue(&[Message::to("w").json(&1).unwrap()]);
    let mut tx = store.begin().await.unwrap();
    tx.write(w).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        count(
            &store,
            "SELECT count(*) FROM w_a WHERE n = 2 AND at IS NOT NULL"
        )
        .await,
        1
    );
    assert_eq!(
        count(&store, "SELECT count(*) FROM w_b WHERE t IS NOT NULL").await,
        1
    );
    assert_eq!(count(&store, "SELECT count(*) FROM w_c").await, 1);
    assert_eq!(store.admin().stats().await.unwrap().pending, 1);

    // Again: `at` keeps its value, `t` stays, `n` changes.
    let mut w = Writes::new();
    w.upsert(&A, vec![Datum::Id(id), Datum::from(3), Datum::Null]);
    w.upsert(
        &B,
        vec![Datum::Id(id), Datum::from(0), Datum::Null, Datum::Null],
    );
    let mut tx = store.begin().await.unwrap();
    tx.write(w).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        count(
            &store,
            "SELECT count(*) FROM w_a WHERE n = 3 AND at IS NOT NULL"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &store,
            "SELECT count(*) FROM w_b WHERE t IS NOT NULL AND doc IS NULL"
        )
        .await,
        1
    );

    // An insert of a stored key fails; a row that does not fit is refused.
    let mut w = Writes::new();
    w.insert(&C, vec![Datum::from("c"), Datum::from(false)]);
    let mut tx = store.begin().await.unwrap();
    assert!(tx.write(w).await.is_err());
    drop(tx);
    let mut w = Writes::new();
    w.insert(&C, vec![Datum::from("d")]);
    let mut tx = store.begin().await.unwrap();
    assert!(matches!(tx.write(w).await, Err(Error::Corrupt { .. })));
    let mut w = Writes::new();
    w.insert(&C, vec![Datum::Int(1), Datum::from(true)]);
    assert!(matches!(tx.write(w).await, Err(Error::Corrupt { .. })));
    tx.rollback().await.unwrap();
    assert_eq!(count(&store, "SELECT count(*) FROM w_c").await, 1);
}
both_backends!(write_tests, rows_written_as_data);

// A hop opened for a message is untouched (its inbox record is its opening's, not its
// work's) until it runs a statement, writes rows or enqueues: what lets an agent whose
// handler failed having done nothing record its failure in that hop.
async fn a_hop_is_untouched_until_it_does_something(backend: Backend) {
    let (store, _) = open(backend).await;
    let flag = if backend == Backend::Sqlite {
        "INTEGER"
    } else {
        "bool"
    };
    let mut tx = store.begin().await.unwrap();
    crate::Sql::new(format!(
        "CREATE TABLE w_c (id TEXT PRIMARY KEY, flag {flag})"
    ))
    .execute(tx.conn())
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let msg = || {
        Message::to("elsewhere")
            .json(&serde_json::json!({}))
            .unwrap()
    };
    for what in ["a statement", "an enqueue", "a write"] {
        let (mut hop, receipt, _) = store
            .hop_receiving_prefetched("untouched", MessageId::new(), None)
            .await
            .unwrap();
        assert_eq!(receipt, Receipt::First);
        assert!(hop.is_untouched(), "a hop just opened is untouched");
        match what {
            "a statement" => {
                crate::Sql::new("SELECT 1")
                    .execute(hop.conn())
                    .await
                    .unwrap();
            }
            "an enqueue" => {
                hop.enqueue(&msg()).await.unwrap();
            }
            _ => {
                let mut w = Writes::new();
                w.insert(&C, vec![Datum::from(what), Datum::from(true)]);
                hop.write(w).await.unwrap();
            }
        }
        assert!(!hop.is_untouched(), "{what} touches a hop");
        hop.rollback().await.unwrap();
    }
}
both_backends!(untouched_tests, a_hop_is_untouched_until_it_does_something);

// A read in a hop (`Tx::read`) returns what `Sql::fetch_all` does (on SQLite's lane it
// runs on the connection directly) and marks the hop as having done something (what a
// read called may have written: the hop is not reused for a failure).
async fn a_read_in_a_hop_reads_as_fetch_all(backend: Backend) {
    let (store, _) = open(backend).await;
    let sql = || {
        crate::Sql::new("SELECT ? AS t, ? AS n, ? AS absent, {now_ms} AS now")
            .bind("text")
            .bind(7_i64)
            .bind(None::<i64>)
    };
    let expected = sql().fetch_all(store.reader()).await.unwrap();
    let (mut hop, _, _) = store
        .hop_receiving_prefetched("reads", MessageId::new(), None)
        .await
        .unwrap();
    let rows = hop.read(&sql()).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].text("t").unwrap(), expected[0].text("t").unwrap());
    assert_eq!(rows[0].int("n").unwrap(), 7);
    assert_eq!(rows[0].opt_text("absent").unwrap(), None);
    assert!(rows[0].int("now").unwrap() > 0);
    assert!(!hop.is_untouched(), "a read counts");
    hop.rollback().await.unwrap();
}
both_backends!(read_tests, a_read_in_a_hop_reads_as_fetch_all);

// On PostgreSQL's set lane a hop's read needs no savepoint, and a read that fails
// fails the hop's batch at its commit (PostgreSQL aborted the transaction): nothing
// of it is kept, its message not recorded. A good read commits. SQLite's failed read
// leaves its transaction as it was.
async fn a_failed_read_in_a_set_batch_keeps_nothing(backend: Backend) {
    use crate::read::Prefetch;
    let (store, _) = open(backend).await;
    load_tables(&store, backend).await;
    let bad = crate::Sql::new("SELECT no_such_column FROM outbox");
    let good = crate::Sql::new("SELECT count(*) AS n FROM outbox");
    for (read, fails) in [(&good, false), (&bad, true)] {
        let key = uuid::Uuid::now_v7();
        let message = MessageId::new();
        let (mut hop, _, _) = store
            .hop_receiving_prefetched("reader", message, Some(Prefetch::load(&LOAD, key)))
            .await
            .unwrap();
        assert_eq!(hop.read(read).await.is_err(), fails);
        let committed = hop.commit().await;
        let kept = !(fails && backend == Backend::Postgres);
        assert_eq!(committed.is_ok(), kept, "{committed:?}");
        assert_eq!(store.seen("reader", message).await.unwrap(), kept);
    }
}
both_backends!(set_read_tests, a_failed_read_in_a_set_batch_keeps_nothing);

// `Tx::read` refuses what may write or lock, with nothing run: a write that ran there
// would escape its hop's rollback on PostgreSQL's set lane (no savepoint guards it).
async fn a_read_that_may_write_is_refused(backend: Backend) {
    let (store, _) = open(backend).await;
    let mut tx = store.begin().await.unwrap();
    for text in [
        "DELETE FROM inbox",
        "WITH gone AS (DELETE FROM inbox RETURNING 1) SELECT count(*) FROM gone",
        "SELECT * FROM outbox FOR UPDATE",
        "select 1 from outbox for share",
        "INSERT INTO inbox (consumer, message_id) VALUES ('c', 'x')",
    ] {
        let refused = tx.read(&crate::Sql::new(text)).await;
        assert!(
            matches!(refused, Err(Error::NotARead(_))),
            "{text}: {refused:?}"
        );
    }
    let locking = crate::Sql::new("SELECT seq FROM outbox").for_update();
    assert!(matches!(tx.read(&locking).await, Err(Error::NotARead(_))));
    assert!(
        tx.read(&crate::Sql::new(
            "WITH x AS (SELECT 1 AS n) SELECT n FROM x"
        ))
        .await
        .is_ok()
    );
    tx.rollback().await.unwrap();
}
both_backends!(not_a_read_tests, a_read_that_may_write_is_refused);
