//! [`Sql`](crate::Sql): one statement's text for every driver, its values typed, its
//! rows read alike; and [`Load`](crate::read::Load), a row with its children.

use super::*;
use crate::Sql;
use crate::read::Load;
use crate::write::{Column, Kind, Table};

/// A table of every type a statement binds, as each backend stores them.
async fn typed_table(store: &Store) {
    let ddl = if store.backend() == "postgres" {
        "CREATE TABLE typed (id UUID PRIMARY KEY, n BIGINT, r DOUBLE PRECISION, t TEXT,
            b BOOLEAN, j JSONB, at TIMESTAMPTZ)"
    } else {
        "CREATE TABLE typed (id TEXT PRIMARY KEY, n INTEGER, r REAL, t TEXT, b INTEGER,
            j TEXT, at INTEGER)"
    };
    let mut tx = store.begin().await.unwrap();
    Sql::new(ddl).execute(tx.conn()).await.unwrap();
    tx.commit().await.unwrap();
}

// Values of each type go in and come back as they went, NULLs too; a statement first
// run with a NULL where a later run has a value (sqlx prepares it once) still takes the
// value; times come back as Unix milliseconds, JSON as its text.
async fn values_round_trip(backend: Backend) {
    let (store, _) = open(backend).await;
    typed_table(&store).await;
    let insert = |id: uuid::Uuid| {
        Sql::new("INSERT INTO typed (id, n, r, t, b, j, at) VALUES (?, ?, ?, ?, ?, ?, ?)").bind(id)
    };
    let (a, b) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let mut tx = store.begin().await.unwrap();
    insert(a)
        .bind(None::<i64>)
        .bind(None::<f64>)
        .bind(None::<&str>)
        .bind(None::<bool>)
        .bind_json(None)
        .bind_time(None)
        .execute(tx.conn())
        .await
        .unwrap();
    insert(b)
        .bind(7_i64)
        .bind(0.5)
        .bind("text")
        .bind(true)
        .bind_json(r#"{"k": [1, 2]}"#)
        .bind_time(1_732_850_000_123)
        .execute(tx.conn())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // The same statement, a NULL id first, then a value.
    let by_id = |id: Option<uuid::Uuid>| {
        Sql::new("SELECT id, n, r, t, b, j, at FROM typed WHERE (? IS NULL OR id = ?) ORDER BY id")
            .bind(id)
            .bind(id)
    };
    assert_eq!(
        by_id(None).fetch_all(store.reader()).await.unwrap().len(),
        2
    );
    let row = by_id(Some(b)).fetch_one(store.reader()).await.unwrap();
    assert_eq!(row.uuid("id").unwrap(), b);
    assert_eq!(row.int("n").unwrap(), 7);
    assert!((row.real("r").unwrap() - 0.5).abs() < f64::EPSILON);
    assert_eq!(row.text("t").unwrap(), "text");
    assert!(row.bool("b").unwrap());
    let json: serde_json::Value = serde_json::from_str(&row.text("j").unwrap()).unwrap();
    assert_eq!(json, serde_json::json!({"k": [1, 2]}));
    assert_eq!(row.int("at").unwrap(), 1_732_850_000_123);
    let row = by_id(Some(a)).fetch_one(store.reader()).await.unwrap();
    for column in ["n", "r", "t", "b", "j", "at"] {
        assert_eq!(row.opt_text(column).ok().flatten(), None, "{column}");
        assert_eq!(row.opt_int(column).ok().flatten(), None, "{column}");
    }
    // `{ms …}` and a time bound compare alike on both: whole milliseconds.
    let n = Sql::new("SELECT count(*) AS n FROM typed WHERE {ms at} = ? AND at < ?")
        .bind(1_732_850_000_123_i64)
        .bind_time(1_732_850_000_124)
        .fetch_one(store.reader())
        .await
        .unwrap()
        .int("n")
        .unwrap();
    assert_eq!(n, 1);
}
both_backends!(values_round_trip_tests, values_round_trip);

// "Now" is the database's clock where it has one: a row written now is younger than a
// moment ago and older than a moment ahead; `{now_ms}` and `{clock_ms}` read it.
async fn now_and_ages(backend: Backend) {
    let (store, _) = open(backend).await;
    typed_table(&store).await;
    let mut tx = store.begin().await.unwrap();
    Sql::new("INSERT INTO typed (id, at) VALUES (?, ?)")
        .bind(uuid::Uuid::now_v7())
        .bind_now(crate::clock::system_now_ms())
        .execute(tx.conn())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let count = |sql: &'static str, ms: i64| {
        let store = store.clone();
        async move {
            Sql::new(sql)
                .bind_ago(ms)
                .fetch_one(store.reader())
                .await
                .unwrap()
                .int("n")
                .unwrap()
        }
    };
    assert_eq!(
        count("SELECT count(*) AS n FROM typed WHERE at > ?", 60_000).await,
        1
    );
    assert_eq!(
        count("SELECT count(*) AS n FROM typed WHERE at < ?", -60_000).await,
        1
    );
    assert_eq!(
        count("SELECT count(*) AS n FROM typed WHERE at < ?", 60_000).await,
        0
    );
    let row = Sql::new("SELECT {now_ms} AS now, {clock_ms} AS clock")
        .fetch_one(store.reader())
        .await
        .unwrap();
    let here = crate::clock::system_now_ms();
    assert!((row.int("now").unwrap() - here).abs() < 60_000, "{row:?}");
    #[allow(clippy::cast_precision_loss)]
    let close = (row.real("clock").unwrap() - here as f64).abs() < 60_000.0;
    assert!(close, "{row:?}");
}
both_backends!(now_and_ages_tests, now_and_ages);

// A statement whose `?`s and values do not pair up is refused with a typed error,
// nothing run; a row lock and a named lock run on every driver.
async fn mismatches_and_locks(backend: Backend) {
    let (store, _) = open(backend).await;
    let err = Sql::new("SELECT ? AS a")
        .fetch_one(store.reader())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("do not pair up"), "{err}");
    let err = Sql::new("SELECT 1 AS a")
        .bind(1_i64)
        .fetch_one(store.reader())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("do not pair up"), "{err}");
    let mut tx = store.begin().await.unwrap();
    let mut conn = tx.conn();
    conn.lock("a name").await.unwrap();
    let rows = Sql::new("SELECT seq FROM outbox WHERE destination = ?")
        .bind("none")
        .for_update()
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert!(rows.is_empty());
    tx.commit().await.unwrap();
}
both_backends!(mismatches_and_locks_tests, mismatches_and_locks);

// A load reads a row with its children in order, the same on every driver; none for
// no such row; a row without children has none.
async fn loads(backend: Backend) {
    static PARENT: Table = Table::new(
        "load_parent",
        &[Column::new("k", Kind::Id), Column::new("v", Kind::Text)],
        1,
    );
    static CHILD: Table = Table::new(
        "load_child",
        &[
            Column::new("k", Kind::Id),
            Column::new("i", Kind::Int),
            Column::new("v", Kind::Text),
        ],
        2,
    );
    static LOAD: Load = Load::new(&PARENT, &["v"], &CHILD, &["i", "v"]);
    let (store, _) = open(backend).await;
    let id = if backend == Backend::Postgres {
        "UUID"
    } else {
        "TEXT"
    };
    let (with, without) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let mut tx = store.begin().await.unwrap();
    for ddl in [
        format!("CREATE TABLE load_parent (k {id} PRIMARY KEY, v TEXT)"),
        format!("CREATE TABLE load_child (k {id}, i INTEGER, v TEXT, PRIMARY KEY (k, i))"),
    ] {
        Sql::new(ddl).execute(tx.conn()).await.unwrap();
    }
    for k in [with, without] {
        Sql::new("INSERT INTO load_parent (k, v) VALUES (?, 'p')")
            .bind(k)
            .execute(tx.conn())
            .await
            .unwrap();
    }
    for i in [2_i64, 0, 1] {
        Sql::new("INSERT INTO load_child (k, i, v) VALUES (?, ?, ?)")
            .bind(with)
            .bind(i)
            .bind(format!("c{i}"))
            .execute(tx.conn())
            .await
            .unwrap();
    }
    let loaded = LOAD.fetch(tx.conn(), with).await.unwrap().expect("a row");
    assert_eq!(loaded.parent.text("v").unwrap(), "p");
    let children: Vec<String> = loaded
        .children
        .iter()
        .map(|c| c.text("v").unwrap())
        .collect();
    assert_eq!(children, ["c0", "c1", "c2"]);
    let alone = LOAD
        .fetch(tx.conn(), without)
        .await
        .unwrap()
        .expect("a row");
    assert!(alone.children.is_empty());
    assert!(
        LOAD.fetch(tx.conn(), uuid::Uuid::now_v7())
            .await
            .unwrap()
            .is_none()
    );
    tx.commit().await.unwrap();
}
both_backends!(load_tests, loads);
