//! `prune` and `migrate`: what they delete, and who migrates.

use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_core::{Message, MessageId, Receipt, Store};
use serde_json::json;

use crate::common::{fails, ok};
use crate::documents::*;

/// Runs `sql` (one statement, `id` bound as its one parameter if given) in a
/// transaction of its own.
pub(crate) async fn exec(
    store: &Store,
    sqlite: &'static str,
    postgres: &'static str,
    id: Option<MessageId>,
) {
    let mut tx = store.begin().await.unwrap();
    let sql = if store.backend() == "postgres" {
        postgres
    } else {
        sqlite
    };
    let mut q = agentsaga_core::Sql::new(sql);
    if let Some(id) = id {
        q = q.bind(id);
    }
    q.execute(tx.conn()).await.unwrap();
    tx.commit().await.unwrap();
}

/// Is the inbox record (`consumer`, `id`) still there? (Asked by receiving it again, in
/// a transaction rolled back.)
pub(crate) async fn has_record(store: &Store, consumer: &str, id: MessageId) -> bool {
    let mut tx = store.begin().await.unwrap();
    let r = tx.receive(consumer, id).await.unwrap();
    tx.rollback().await.unwrap();
    r == Receipt::Duplicate
}

/// `prune` never deletes an inbox record inside the redelivery window, whatever
/// `--older-than` says; nor, however old, one whose message this database may still
/// deliver again (its outbox row not delivered: a process was down, its lease ran out
/// meanwhile, and the relay will hand the message over again after the restart).
pub(crate) async fn prune_keeps_inbox_records_a_redelivery_can_still_need(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    let live = Message::to("mailer").json(&json!({"n": 1})).unwrap();
    let (young, old, old_live) = (MessageId::new(), MessageId::new(), live.id);
    let mut tx = store.begin().await.unwrap();
    tx.enqueue(&live).await.unwrap();
    for id in [young, old, old_live] {
        assert_eq!(tx.receive("mailer", id).await.unwrap(), Receipt::First);
    }
    tx.commit().await.unwrap();
    // Two of them received a day ago.
    for id in [old, old_live] {
        exec(
            &store,
            "UPDATE inbox SET received_at = received_at - 86400000 WHERE message_id = ?",
            "UPDATE inbox SET received_at = received_at - interval '1 day' WHERE message_id = ?",
            Some(id),
        )
        .await;
    }
    store.close().await;

    let out = ok(&url, &["prune", "--older-than", "0s"]);
    assert!(out.contains(" and 1 inbox record(s) older than "), "{out}");
    assert!(out.contains("redelivery window"), "{out}");
    let store = Store::connect(&url).await.unwrap();
    assert!(
        has_record(&store, "mailer", young).await,
        "a record inside the redelivery window was pruned"
    );
    assert!(
        has_record(&store, "mailer", old_live).await,
        "the record of a message still to be delivered was pruned"
    );
    assert!(
        !has_record(&store, "mailer", old).await,
        "the old record is kept"
    );
    store.close().await;
}

/// The applied migrations and the number of columns of every table: what a command
/// that wrote the schema would change.
pub(crate) async fn schema_of(url: &str) -> (Vec<i64>, i64) {
    use agentsaga_core::sqlx::{self, Connection as _};
    const VERSIONS: &str = "SELECT version FROM _sqlx_migrations ORDER BY version";
    // The same reads over either backend's connection type.
    macro_rules! read {
        ($conn:ty, $columns:expr) => {{
            let mut c = <$conn>::connect(url).await.unwrap();
            let v = sqlx::query_scalar(VERSIONS)
                .fetch_all(&mut c)
                .await
                .unwrap();
            let n = sqlx::query_scalar($columns)
                .fetch_one(&mut c)
                .await
                .unwrap();
            (v, n)
        }};
    }
    if url.starts_with("sqlite") {
        read!(
            sqlx::SqliteConnection,
            "SELECT count(*) FROM sqlite_master m, pragma_table_info(m.name) WHERE m.type = 'table'"
        )
    } else {
        read!(
            sqlx::PgConnection,
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema()"
        )
    }
}

/// A database whose schema is behind the binary is never migrated by a command other
/// than `migrate`: each refuses it, changing nothing, and says to run `agentsaga
/// migrate`; `migrate` brings it up to date.
pub(crate) async fn only_migrate_migrates(backend: Backend) {
    use agentsaga_core::sqlx::{self, Connection as _};
    let url = fresh_url(backend).await;
    // Migrated up to the migration before the newest, as an older agentsaga left it.
    let migrator = match backend {
        Backend::Sqlite => &agentsaga_core::migrate::SQLITE_MIGRATOR,
        Backend::Postgres => &agentsaga_core::migrate::POSTGRES_MIGRATOR,
    };
    let mut versions: Vec<i64> = migrator.iter().map(|m| m.version).collect();
    versions.sort_unstable();
    let older = versions[versions.len() - 2];
    if url.starts_with("sqlite") {
        let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
        let mut c = sqlx::SqliteConnection::connect_with(&options.create_if_missing(true))
            .await
            .unwrap();
        migrator.run_to(older, &mut c).await.unwrap();
        c.close().await.unwrap();
    } else {
        let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
        migrator.run_to(older, &mut c).await.unwrap();
        c.close().await.unwrap();
    }
    let before = schema_of(&url).await;
    let newest = migrator.iter().map(|m| m.version).max().unwrap();
    assert!(!before.0.contains(&newest), "{before:?}");
    for args in OPENING {
        let e = fails(&url, args);
        assert!(e.contains("Run `agentsaga migrate`"), "{args:?}: {e}");
        assert!(
            e.contains(&format!("behind this binary's {newest}")),
            "{args:?}: {e}"
        );
        assert_eq!(schema_of(&url).await, before, "{args:?} changed the schema");
    }
    let out = ok(&url, &["migrate"]);
    assert!(out.contains(&format!("applied: {newest} ")), "{out}");
    assert!(out.contains("schema up to date"), "{out}");
    assert!(schema_of(&url).await.0.contains(&newest));
    assert_eq!(status(&url)["sagas_total"], 0);
    let out = ok(&url, &["migrate"]);
    assert!(out.contains("nothing to apply"), "{out}");
}
