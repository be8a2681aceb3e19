//! `Store::try_exclusive`: one holder of a name at a time across the processes of a
//! database (two stores on one URL stand for two processes), released by its holder or
//! with it; on PostgreSQL a lost session has lost the right.

use super::*;

// One holder at a time, whoever asks; the next may take it once it is let go, by
// release or by drop.
async fn an_exclusive_right_has_one_holder_at_a_time(backend: Backend) {
    let (a, url) = open(backend).await;
    let b = Store::connect(&url).await.unwrap();
    let mut held = a.try_exclusive("nats.S.svc_pay").await.unwrap().unwrap();
    assert_eq!(held.name(), "nats.S.svc_pay");
    assert!(held.still_held().await);
    assert!(b.try_exclusive("nats.S.svc_pay").await.unwrap().is_none());
    assert!(a.try_exclusive("nats.S.svc_pay").await.unwrap().is_none());
    // Another name is another right.
    let other = b.try_exclusive("nats.S.svc_ship").await.unwrap().unwrap();
    held.release().await;
    let taken = b.try_exclusive("nats.S.svc_pay").await.unwrap().unwrap();
    assert!(a.try_exclusive("nats.S.svc_pay").await.unwrap().is_none());
    drop(taken);
    // On PostgreSQL a dropped session ends on the server a moment later.
    wait_until_taken(&a, "nats.S.svc_pay").await;
    drop(other);
}
both_backends!(exclusive_tests, an_exclusive_right_has_one_holder_at_a_time);

/// Asks for `name` until it is granted (bounded).
async fn wait_until_taken(store: &Store, name: &str) -> crate::Exclusive {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(held) = store.try_exclusive(name).await.unwrap() {
            return held;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "`{name}` was not let go within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_name_outside_its_characters_is_refused(backend: Backend) {
    let (store, _) = open(backend).await;
    for bad in ["", "a b", "a/b", "ü", &"x".repeat(201)] {
        let err = store.try_exclusive(bad).await.expect_err(bad);
        assert!(matches!(err, Error::Exclusive { .. }), "{bad}: {err}");
    }
}
both_backends!(name_tests, a_name_outside_its_characters_is_refused);

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn an_in_memory_database_has_one_holder_too() {
    let store = Store::connect("sqlite::memory:").await.unwrap();
    let held = store
        .try_exclusive("in-memory.once")
        .await
        .unwrap()
        .unwrap();
    assert!(
        store
            .try_exclusive("in-memory.once")
            .await
            .unwrap()
            .is_none()
    );
    drop(held);
    assert!(
        store
            .try_exclusive("in-memory.once")
            .await
            .unwrap()
            .is_some()
    );
}

// The holder's session killed on the server (its process lost the connection): the
// holder finds it no longer holds the right, and another takes it.
#[cfg(feature = "postgres")]
#[tokio::test]
// In a build with PostgreSQL alone, every store is PostgreSQL's.
#[allow(irrefutable_let_patterns)]
async fn postgres_a_lost_session_has_lost_the_right() {
    let (a, url) = open(Backend::Postgres).await;
    let b = Store::connect(&url).await.unwrap();
    let mut held = a.try_exclusive("nats.S.svc_pay").await.unwrap().unwrap();
    assert!(b.try_exclusive("nats.S.svc_pay").await.unwrap().is_none());
    let Db::Postgres(db) = b.backend_ref() else {
        unreachable!("a PostgreSQL store")
    };
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_locks \
         WHERE locktype = 'advisory' AND granted AND database = \
         (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(killed, [true]);
    assert!(!held.still_held().await);
    wait_until_taken(&b, "nats.S.svc_pay").await;
}
