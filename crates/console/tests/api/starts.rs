//! Starts: with a console's definitions, and through `Runtime::admin_router`.

use std::time::Duration;

use agentsaga_console::http::HttpConfig;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::{Saga, SagaId, SagaState, Step};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::fixture::*;
use crate::server::*;

pub(crate) async fn starts_with_an_engine(backend: Backend) {
    let f = prepare(backend).await;
    let console = f.console.clone().with_engine(engine());
    let api = Api::console(&console, HttpConfig::default()).await;
    let before = everything(&f).await;
    let bad = [
        ("{}", StatusCode::BAD_REQUEST, "invalid"),
        ("{\"name\": \"trip\"", StatusCode::BAD_REQUEST, "invalid"),
        (
            "{\"name\": \"trip\", \"key\": 7}",
            StatusCode::BAD_REQUEST,
            "invalid",
        ),
        (
            "{\"name\": \"trip\", \"other\": 1}",
            StatusCode::BAD_REQUEST,
            "invalid",
        ),
        ("{\"name\": \"flight\"}", StatusCode::NOT_FOUND, "not_found"),
    ];
    for (body, status, kind) in bad {
        assert_error(
            &api.post_raw("/api/v1/sagas", body).await,
            status,
            kind,
            body,
        );
    }
    let huge = json!({"name": "trip", "data": "x".repeat(65 * 1024)}).to_string();
    assert_error(
        &api.post_raw("/api/v1/sagas", huge).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        "huge",
    );
    assert_eq!(everything(&f).await, before, "nothing was started");

    let started = api
        .ok_post(
            "/api/v1/sagas",
            json!({"name": "trip", "data": {"case": "ok"}, "key": "order-9"}),
        )
        .await;
    let id: SagaId = started["saga"]["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(started, doc(&console.saga(id).await.unwrap()));
    assert_eq!(started["saga"]["state"], "running");
    assert_eq!(started["saga"]["key"], "order-9");
    assert_eq!(started["data"], json!({"case": "ok"}));
    let again = api
        .ok_post(
            "/api/v1/sagas",
            json!({"name": "trip", "data": {"case": "other"}, "key": "order-9"}),
        )
        .await;
    assert_eq!(again["saga"]["id"], id.to_string(), "one key, one saga");
    let unkeyed = api.ok_post("/api/v1/sagas", json!({"name": "waits"})).await;
    assert_eq!(unkeyed["saga"]["name"], "waits");
    assert_eq!(unkeyed["data"], Value::Null);
    assert_eq!(
        console.status().await.unwrap().sagas_total,
        before["status"]["sagas_total"].as_u64().unwrap() + 2
    );
}

pub(crate) struct Stock;

#[async_trait::async_trait]
impl agentsaga_runtime::Agent for Stock {
    type Command = Value;
    type Reply = String;
    fn destination(&self) -> &str {
        "stock"
    }
    async fn handle(
        &self,
        _: &mut agentsaga_runtime::AgentContext<'_>,
        _: Value,
    ) -> Result<String, agentsaga_runtime::StepError> {
        Ok("reserved".into())
    }
}

pub(crate) async fn the_runtime_router_starts_its_sagas(backend: Backend) {
    let order = Saga::<Value>::builder("order", 1)
        .step(Step::new("reserve", "stock").compensate("stock", |_: &Value| json!("release")))
        .build()
        .unwrap();
    let rt = agentsaga_runtime::Runtime::builder()
        .database(fresh_url(backend).await)
        .agent(Stock)
        .saga(order)
        .start()
        .await
        .unwrap();
    let server = Api::serve(rt.admin_router(HttpConfig {
        action_token: Some("t".into()),
        ..HttpConfig::default()
    }))
    .await;
    let api = server.with_token(Some("t"));
    let started = api
        .ok_post("/api/v1/sagas", json!({"name": "order", "data": {"id": 1}}))
        .await;
    assert_eq!(started["saga"]["name"], "order", "{started}");
    let id: SagaId = started["saga"]["id"].as_str().unwrap().parse().unwrap();
    let state = tokio::time::timeout(Duration::from_secs(30), rt.wait(id))
        .await
        .expect("the saga finishes")
        .unwrap();
    assert_eq!(state, SagaState::Completed);
    let show = api.ok(&format!("/api/v1/sagas/{id}")).await;
    assert_eq!(show["saga"]["state"], "completed");
    assert_eq!(show["steps"][0]["state"], "succeeded");
    let status = api.ok("/api/v1/status").await;
    assert_eq!(status["stalled_after_ms"], 900_000);
    assert_error(
        &api.post("/api/v1/sagas", json!({"name": "trip"})).await,
        StatusCode::NOT_FOUND,
        "not_found",
        "a saga the runtime does not host",
    );
    drop(server);
    rt.shutdown().await;
}
