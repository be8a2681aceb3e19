//! SQLite's state CHECKs (migration `0009_checks_without_in_lists`): written as chains of
//! equalities, they cost no ephemeral table per row written, and a database migrated
//! from the IN-list version keeps its rows, its outbox sequence, its foreign keys and
//! the same constraints.
#![cfg(feature = "sqlite")]
// In a build with SQLite alone, every store is SQLite's: the `else` arms are dead there.
#![allow(irrefutable_let_patterns)]

use agentsaga_core::Store;
use agentsaga_core::migrate::SQLITE_MIGRATOR;
use agentsaga_core::testing::{Backend, fresh_url};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{Row, SqlitePool};

/// The statements that write a state column: none may open an ephemeral table (SQLite's
/// way of evaluating `x IN (…)` over three or more values, once per row).
const WRITES: &[&str] = &[
    "INSERT INTO outbox (id, destination, payload, state, available_at, created_at) \
     VALUES ('m', 'd', '{}', ?, 0, 0)",
    "UPDATE outbox SET state = ? WHERE seq = 1",
    "INSERT INTO saga_instances (id, name, version, state, data, created_at, updated_at) \
     VALUES ('s', 'n', 1, ?, '{}', 0, 0) \
     ON CONFLICT (id) DO UPDATE SET state = excluded.state",
    "INSERT INTO saga_steps (saga_id, idx, stage, name, destination, state, \
     compensation_state) VALUES ('s', 0, 0, 'a', 'd', ?, 'recorded') \
     ON CONFLICT (saga_id, idx) DO UPDATE SET state = excluded.state, \
     compensation_state = excluded.compensation_state",
];

#[tokio::test]
async fn state_checks_open_no_ephemeral_table() {
    let store = Store::connect("sqlite::memory:")
        .await
        .expect("open sqlite::memory:");
    let Some(pool) = store.reader().sqlite() else {
        panic!("sqlite::memory: did not open SQLite")
    };
    for sql in WRITES {
        let opcodes: Vec<String> = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
            .bind("pending")
            .fetch_all(pool)
            .await
            .unwrap_or_else(|e| panic!("EXPLAIN {sql}: {e}"))
            .iter()
            .map(|r| r.get::<String, _>("opcode"))
            .collect();
        assert!(
            opcodes.iter().any(|o| o == "Halt"),
            "not a program: {opcodes:?}"
        );
        assert!(
            !opcodes.iter().any(|o| o == "OpenEphemeral"),
            "{sql} opens an ephemeral table: {opcodes:?}"
        );
    }
}

/// A file database migrated up to 0008 (the IN-list CHECKs), with rows in every table
/// 0009 rebuilds.
async fn database_at_0008() -> (String, SqlitePool) {
    let url = fresh_url(Backend::Sqlite).await;
    let options: SqliteConnectOptions = url.parse().expect("a sqlite url");
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options.create_if_missing(true).foreign_keys(true))
        .await
        .expect("open the file");
    SQLITE_MIGRATOR
        .run_to(8, &pool)
        .await
        .expect("migrate to 0008");
    for sql in [
        "INSERT INTO outbox (id, destination, key, payload, state, attempts, available_at, \
         lease_owner, lease_until, created_at) VALUES \
         ('m1', 'agent', 'k1', '{\"n\":1}', 'pending', 0, 10, NULL, NULL, 1), \
         ('m2', 'agent', 'k2', '{\"n\":2}', 'in_flight', 1, 10, 'relay-1', 99, 2), \
         ('m3', 'agent', NULL, '{\"n\":3}', 'dead', 5, 10, NULL, NULL, 3), \
         ('m4', 'agent', NULL, '{\"n\":4}', 'delivered', 1, 10, NULL, NULL, 4)",
        // The highest seq pruned: the sequence stays above the rows left.
        "DELETE FROM outbox WHERE id = 'm4'",
        "INSERT INTO saga_instances (id, name, version, state, data, created_at, updated_at) \
         VALUES ('s1', 'trip', 1, 'running', '{}', 1, 1), \
                ('s2', 'trip', 1, 'compensated', '{}', 1, 2)",
        "INSERT INTO saga_steps (saga_id, idx, stage, name, destination, state, \
         compensation_state) VALUES \
         ('s1', 0, 0, 'book', 'agent', 'succeeded', 'recorded'), \
         ('s1', 1, 1, 'pay', 'agent', 'dispatched', NULL), \
         ('s2', 0, 0, 'book', 'agent', 'failed', 'done')",
        "INSERT INTO saga_signals (saga_id, name) VALUES ('s1', 'approval')",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    (url, pool)
}

/// Every table and index of the database: kind, name, SQL (sqlx's own table aside).
async fn schema(store: &Store) -> Vec<(String, String, Option<String>)> {
    let Some(pool) = store.reader().sqlite() else {
        panic!("not SQLite")
    };
    sqlx::query_as(
        "SELECT type, name, sql FROM sqlite_master \
         WHERE name <> '_sqlx_migrations' AND name NOT LIKE 'sqlite_autoindex__sqlx%' \
         ORDER BY type, name",
    )
    .fetch_all(pool)
    .await
    .expect("read the schema")
}

/// One value read on the store's writer (the connection that migrated).
async fn write_scalar(store: &Store, sql: &str) -> i64 {
    let mut tx = store.begin().await.expect("begin");
    let Some(c) = tx.conn().into_sqlite() else {
        panic!("not SQLite")
    };
    let v = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(&mut *c)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    tx.commit().await.expect("commit");
    v
}

async fn scalar(store: &Store, sql: &str) -> i64 {
    let Some(pool) = store.reader().sqlite() else {
        panic!("not SQLite")
    };
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Runs `sql` in a transaction of the store's writer (the connection that migrated).
async fn write(store: &Store, sql: &str) -> Result<u64, sqlx::Error> {
    let mut tx = store.begin().await.expect("begin");
    let Some(c) = tx.conn().into_sqlite() else {
        panic!("not SQLite")
    };
    let done = sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&mut *c)
        .await?
        .rows_affected();
    tx.commit().await.expect("commit");
    Ok(done)
}

#[tokio::test]
async fn upgrading_keeps_rows_sequence_keys_and_constraints() {
    let (url, old) = database_at_0008().await;
    let hwm: i64 = sqlx::query_scalar("SELECT seq FROM sqlite_sequence WHERE name = 'outbox'")
        .fetch_one(&old)
        .await
        .expect("the outbox sequence");
    assert_eq!(hwm, 4, "the pruned row's seq is the high-water mark");
    old.close().await;

    let store = Store::connect(&url)
        .await
        .expect("open and migrate to 0009");
    let newest = agentsaga_core::migrate::SQLITE_MIGRATOR
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap();
    assert_eq!(
        scalar(&store, "SELECT max(version) FROM _sqlx_migrations").await,
        newest
    );
    assert!(
        scalar(
            &store,
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' \
             AND (sql LIKE '%CHECK (state IN%' OR sql LIKE '%compensation_state IN%')"
        )
        .await
            == 0,
        "a CHECK with an IN list is left"
    );
    // The rows, as they were.
    assert_eq!(scalar(&store, "SELECT count(*) FROM outbox").await, 3);
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM outbox WHERE id = 'm2' AND state = 'in_flight' \
             AND lease_owner = 'relay-1' AND lease_until = 99 AND attempts = 1 AND seq = 2"
        )
        .await,
        1
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM saga_instances").await,
        2
    );
    assert_eq!(scalar(&store, "SELECT count(*) FROM saga_steps").await, 3);
    assert_eq!(scalar(&store, "SELECT count(*) FROM saga_signals").await, 1);
    // The schema, object for object (tables, indexes and their SQL), is a fresh
    // database's.
    let fresh = Store::connect("sqlite::memory:")
        .await
        .expect("open sqlite::memory:");
    assert_eq!(schema(&store).await, schema(&fresh).await);
    assert!(
        schema(&store)
            .await
            .iter()
            .any(|(kind, name, _)| kind == "index" && name == "outbox_key_in_flight"),
        "the schema read is empty"
    );
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM pragma_integrity_check WHERE integrity_check <> 'ok'"
        )
        .await,
        0
    );
    assert_eq!(
        scalar(&store, "SELECT count(*) FROM pragma_foreign_key_check").await,
        0
    );

    // The sequence keeps its high-water mark: no pruned seq is reused.
    write(
        &store,
        "INSERT INTO outbox (id, destination, payload, available_at, created_at) \
         VALUES ('m5', 'agent', '{}', 10, 5)",
    )
    .await
    .expect("insert");
    assert_eq!(
        scalar(&store, "SELECT seq FROM outbox WHERE id = 'm5'").await,
        5
    );

    // The constraints hold: every state of the lists passes, any other value fails,
    // a missing compensation state passes.
    for bad in [
        "UPDATE outbox SET state = 'lost' WHERE id = 'm1'",
        "UPDATE saga_instances SET state = 'done' WHERE id = 's1'",
        "UPDATE saga_steps SET state = 'running' WHERE saga_id = 's1' AND idx = 0",
        "UPDATE saga_steps SET compensation_state = 'maybe' WHERE saga_id = 's1' AND idx = 0",
    ] {
        let e = write(&store, bad).await.expect_err(bad);
        assert!(
            e.to_string().contains("CHECK constraint failed"),
            "{bad}: {e}"
        );
    }
    for good in [
        "UPDATE outbox SET state = 'delivered', lease_owner = NULL WHERE id = 'm2'",
        "UPDATE saga_instances SET state = 'aborted' WHERE id = 's1'",
        "UPDATE saga_steps SET state = 'failed', compensation_state = 'skipped' \
         WHERE saga_id = 's1' AND idx = 0",
        "UPDATE saga_steps SET compensation_state = NULL WHERE saga_id = 's1' AND idx = 0",
    ] {
        assert_eq!(write(&store, good).await.expect(good), 1, "{good}");
    }

    // Foreign keys are on again on the writer, their cascades intact.
    assert_eq!(
        write_scalar(&store, "SELECT foreign_keys FROM pragma_foreign_keys").await,
        1
    );
    let e = write(
        &store,
        "INSERT INTO saga_steps (saga_id, idx, stage, name, destination, state) \
         VALUES ('nobody', 0, 0, 'a', 'agent', 'dispatched')",
    )
    .await
    .expect_err("a step of no saga");
    assert!(e.to_string().contains("FOREIGN KEY"), "{e}");
    write(&store, "DELETE FROM saga_instances WHERE id = 's1'")
        .await
        .expect("delete a saga");
    assert_eq!(
        scalar(
            &store,
            "SELECT count(*) FROM saga_steps WHERE saga_id = 's1'"
        )
        .await,
        0
    );
    assert_eq!(scalar(&store, "SELECT count(*) FROM saga_signals").await, 0);
}

/// The migration run again over its own result (a crash between its commit and sqlx's
/// record of it, or a second process migrating the same file at once) changes nothing:
/// same schema, same rows, same sequence.
#[tokio::test]
async fn running_0009_again_changes_nothing() {
    let (url, old) = database_at_0008().await;
    // At 0009 exactly: later migrations change what 0009 built (0012 makes
    // outbox_key_in_flight unique), so "over its own result" is the schema at 0009.
    SQLITE_MIGRATOR
        .run_to(9, &old)
        .await
        .expect("migrate to 0009");
    let schema_at = |pool: &SqlitePool| {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (String, String, Option<String>)>(
                "SELECT type, name, sql FROM sqlite_master \
                 WHERE name <> '_sqlx_migrations' AND name NOT LIKE 'sqlite_autoindex__sqlx%' \
                 ORDER BY type, name",
            )
            .fetch_all(&pool)
            .await
            .expect("read the schema")
        }
    };
    let rows = |pool: &SqlitePool| {
        let pool = pool.clone();
        async move {
            let mut counts = Vec::new();
            for sql in [
                "SELECT count(*) FROM outbox",
                "SELECT count(*) FROM saga_instances",
                "SELECT count(*) FROM saga_steps",
                "SELECT count(*) FROM saga_signals",
                "SELECT seq FROM sqlite_sequence WHERE name = 'outbox'",
            ] {
                let n: i64 = sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap();
                counts.push(n);
            }
            counts
        }
    };
    let before = schema_at(&old).await;
    let counted = rows(&old).await;
    assert_eq!(counted, [3, 2, 3, 1, 4]);
    // As a second process would: on a connection of its own, with foreign keys on.
    let options: SqliteConnectOptions = url.parse().expect("a sqlite url");
    let other = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options.foreign_keys(true))
        .await
        .expect("open the file again");
    sqlx::raw_sql(sqlx::AssertSqlSafe(include_str!(
        "../../../migrations/sqlite/0009_checks_without_in_lists.sql"
    )))
    .execute(&other)
    .await
    .expect("run 0009 again");
    other.close().await;
    assert_eq!(schema_at(&old).await, before);
    assert_eq!(rows(&old).await, counted);
    old.close().await;
    let store = Store::connect(&url)
        .await
        .expect("open and migrate the rest");
    assert_eq!(
        write_scalar(&store, "SELECT foreign_keys FROM pragma_foreign_keys").await,
        1
    );
}
