//! A linked runtime's own console (`Runtime::admin_router`): its remote destination,
//! listed before any service consumes it and then with the broker's figures, and the
//! destinations it hosts, with its own consumers.

use agentsaga_console::http::{self, HttpConfig};
use async_nats::jetstream;
use serde_json::Value;

use super::*;

/// `GET /api/v1/remote` of `app`, served on 127.0.0.1 for the call.
async fn remote(app: &axum::Router) -> Value {
    serde_json::from_str(&get(app, "/api/v1/remote").await).unwrap()
}

/// The body of `GET path` of `app`, served on 127.0.0.1 for the call.
async fn get(app: &axum::Router, path: &str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(http::serve(listener, app.clone(), async move {
        let _ = stopped.await;
    }));
    let doc = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let _ = stop.send(());
    served.await.unwrap().unwrap();
    doc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_runtime_console_shows_its_destinations_on_the_broker() {
    let server = NatsServer::start();
    let shop = shop(&fresh_url(Backend::Sqlite).await, &server).await;
    let app = shop.admin_router(HttpConfig::default());
    let doc = remote(&app).await;
    assert_eq!(doc["error"], Value::Null, "{doc}");
    let rows = |doc: &Value| -> Vec<(String, String)> {
        doc["destinations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let s = |k: &str| d[k].as_str().unwrap_or("-").to_owned();
                (s("destination"), s("consumer"))
            })
            .collect()
    };
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(d, c)| ((*d).to_owned(), (*c).to_owned()))
            .collect()
    };
    assert_eq!(
        rows(&doc),
        pairs(&[
            ("payments", "-"),
            ("saga.order.child", "shop_saga_order_child"),
            ("saga.order.v1", "shop_saga_order_v1"),
            ("ship", "shop_ship"),
            ("stock", "shop_stock"),
        ])
    );

    // The payments service's consumer, made and then gone: two charges wait there.
    let js = jetstream::new(async_nats::connect(&server.url()).await.unwrap());
    js.get_stream("AGENTSAGA")
        .await
        .unwrap()
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("payments_payments".into()),
            filter_subject: "agentsaga.payments".into(),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    start_orders(&shop, 0..2).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let doc = remote(&app).await;
        let payments = &doc["destinations"][0];
        if payments["consumer"] == "payments_payments" && payments["pending"] == 2 {
            assert_eq!(payments["ack_pending"], 0, "{doc}");
            assert_eq!(payments["outbox_pending"], 0, "published: {doc}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{doc}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shop.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_reaches_a_secured_broker_and_shows_no_password() {
    let server = NatsServer::start_with(&["--user", "ops", "--pass", "s3cret"]);
    let url = format!("nats://ops:s3cret@127.0.0.1:{}", server.port());
    // A wrong password: refused, named without it.
    let wrong = url.replace("s3cret", "wr0ng-s3cret");
    let e = NatsLink::connect(&wrong, "shop")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("nats://ops:***@127.0.0.1"), "{e}");
    assert!(!e.contains("s3cret"), "{e}");

    let link = NatsLink::connect(&url, "shop").await.unwrap();
    assert!(!format!("{link:?}").contains("s3cret"), "{link:?}");
    assert!(!link.url().contains("s3cret"), "{}", link.url());
    let shop = Runtime::builder()
        .database(&fresh_url(Backend::Sqlite).await)
        .agent(Recorder("stock"))
        .agent(Recorder("ship"))
        .saga(saga())
        .remote("payments", &link)
        .start()
        .await
        .unwrap();
    let app = shop.admin_router(HttpConfig::default());
    let doc = remote(&app).await;
    assert_eq!(doc["error"], Value::Null, "connected: {doc}");
    let broker = doc["broker"].as_str().unwrap();
    assert!(broker.starts_with("nats://ops:***@127.0.0.1:"), "{doc}");
    for path in ["/api/v1/remote", "/api/v1/status", "/"] {
        let body = get(&app, path).await;
        assert!(body.contains("ops:***@127.0.0.1"), "{path}: {body}");
        assert!(!body.contains("s3cret"), "{path}: {body}");
    }
    shop.shutdown().await;
}
