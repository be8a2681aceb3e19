//! Opening a database: migrations applied once, a newer schema refused, bad URLs.

use super::*;

// Migrations apply once and reopen cleanly; a newer schema is refused.
async fn migrations(backend: Backend) {
    let (store, url) = open(backend).await;
    enqueue_one(&store, &Message::to("a")).await;
    store.close().await;
    let store = Store::connect(&url).await.expect("reopen");
    assert_eq!(store.admin().stats().await.unwrap().pending, 1);
    let sql = match backend {
        Backend::Sqlite => {
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (99990101000000, 'from the future', 1, x'00', 0)"
        }
        Backend::Postgres => {
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (99990101000000, 'from the future', true, '\\x00', 0)"
        }
    };
    exec(&store, sql).await;
    store.close().await;
    match Store::connect(&url).await {
        Err(Error::SchemaTooNew { found, .. }) => assert_eq!(found, 99990101000000),
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}
both_backends!(migration_tests, migrations);

#[tokio::test]
async fn bad_urls_are_typed_errors() {
    for url in [
        "mysql://x",
        "nonsense",
        "",
        "postgres://127.0.0.1:notaport/x",
    ] {
        match Store::connect(url).await {
            Err(Error::InvalidUrl { reason, .. }) => assert!(!reason.is_empty()),
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }
    let err = Store::connect("sqlite:///nonexistent-dir/deeper/x.db")
        .await
        .unwrap_err();
    #[cfg(feature = "sqlite")]
    assert!(
        matches!(
            err,
            Error::Connect {
                scheme: "sqlite",
                ..
            }
        ),
        "{err}"
    );
    // A build without the backend refuses its URLs by name.
    #[cfg(not(feature = "sqlite"))]
    assert!(
        matches!(&err, Error::InvalidUrl { reason, .. } if reason.contains("`sqlite` feature is off")),
        "{err}"
    );
    // A closed port on loopback: refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://u@127.0.0.1:{port}/db?connect_timeout=2");
    let config = StoreConfig {
        acquire_timeout: Duration::from_secs(2),
        ..StoreConfig::default()
    };
    let err = Store::connect_with(&url, config).await.unwrap_err();
    #[cfg(feature = "postgres")]
    assert!(
        matches!(
            err,
            Error::Connect {
                scheme: "postgres",
                ..
            }
        ),
        "{err}"
    );
    #[cfg(not(feature = "postgres"))]
    assert!(
        matches!(&err, Error::InvalidUrl { reason, .. } if reason.contains("`postgres` feature is off")),
        "{err}"
    );
    assert!(err.to_string().contains("postgres"), "{err}");
}
