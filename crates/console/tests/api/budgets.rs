//! Usage and budgets: `GET /sagas/{id}` shows what a saga and each of its steps used,
//! its budget and whether it waits for a raise; `POST /sagas/{id}/budget` raises it
//! (a bad body is a 400, a finished saga a 409, nothing changed either way).

use agentsaga_console::Console;
use agentsaga_console::http::HttpConfig;
use agentsaga_core::Store;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::testing::{capped, pump, quick_engine, trip, waiting_for_raise};
use agentsaga_saga::{SagaId, query};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::fixture::start;
use crate::server::*;

pub(crate) async fn budgets_show_and_a_person_raises_them(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await)
        .await
        .expect("connect");
    let engine = quick_engine([trip(), capped()]);
    let usage = json!({"tokens_in": 10, "tokens_out": 20, "calls": 1});
    let data = json!({"case": "ok", "usage": usage});
    let used = start(&store, &engine, "trip", None, data).await;
    pump(&store, &engine, &[used]).await;
    let waiting = waiting_for_raise(&store, &engine).await;
    // As `agentsaga serve` has it: no definitions.
    let console = Console::new(store.clone());
    let api = Api::console(&console, HttpConfig::default()).await;

    // A completed saga's usage, per step and in all; no budget.
    let shown = api.ok(&format!("/api/v1/sagas/{used}")).await;
    assert_eq!(shown, doc(&console.saga(used).await.unwrap()));
    let spending = &shown["spending"];
    assert_eq!(
        spending["usage"],
        json!({"tokens_in": 30, "tokens_out": 60, "calls": 3}),
        "{shown}"
    );
    assert_eq!(spending["budget"], Value::Null, "{shown}");
    assert_eq!(spending["waiting_for_raise"], false, "{shown}");
    for step in shown["steps"].as_array().unwrap() {
        assert_eq!(step["usage"], usage, "{step}");
    }

    // A saga whose budget is spent, waiting for a person.
    let held = api.ok(&format!("/api/v1/sagas/{waiting}")).await;
    let spending = &held["spending"];
    assert_eq!(spending["budget"], json!({"tokens_out": 100}), "{held}");
    assert_eq!(spending["on_spent"], "wait", "{held}");
    assert_eq!(spending["spent"], "tokens_out 100 of 100", "{held}");
    assert_eq!(spending["waiting_for_raise"], true, "{held}");
    assert_eq!(held["steps"].as_array().unwrap().len(), 1, "{held}");

    // Bad raises change nothing.
    let raise = format!("/api/v1/sagas/{waiting}/budget");
    let before = api.ok(&format!("/api/v1/sagas/{waiting}")).await;
    for (body, why) in [
        (Value::Null, "empty"),
        (json!({}), "no limit"),
        (json!({"tokens": 500}), "unknown"),
        (json!({"tokens_out": -1}), "negative"),
        (json!({"tokens_out": "lots"}), "a string"),
        (json!([500]), "an array"),
    ] {
        let got = api.post(&raise, body).await;
        assert_error(&got, StatusCode::BAD_REQUEST, "invalid", why);
        let message = got.1["error"]["message"].as_str().unwrap().to_owned();
        match why {
            "unknown" => assert!(message.contains("unknown field `tokens`"), "{message}"),
            "no limit" => assert!(message.contains("names no limit"), "{message}"),
            "empty" => assert!(message.contains("body is empty"), "{message}"),
            _ => {}
        }
    }
    for (path, status, kind) in [
        (
            format!("/api/v1/sagas/{waiting}/budget?force=1"),
            StatusCode::BAD_REQUEST,
            "invalid",
        ),
        (
            "/api/v1/sagas/nope/budget".to_owned(),
            StatusCode::BAD_REQUEST,
            "invalid",
        ),
        (
            format!("/api/v1/sagas/{}/budget", SagaId::new()),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            format!("/api/v1/sagas/{used}/budget"),
            StatusCode::CONFLICT,
            "refused",
        ),
    ] {
        let got = api.post(&path, json!({"tokens_out": 1000})).await;
        assert_error(&got, status, kind, &path);
    }
    assert_eq!(api.ok(&format!("/api/v1/sagas/{waiting}")).await, before);
    assert_eq!(api.ok(&format!("/api/v1/sagas/{used}")).await, shown);

    // A raise: the limit it names replaces the old one; the saga goes on once its
    // orchestrator is woken, and completes.
    let raised = api.ok_post(&raise, json!({"tokens_out": 1000})).await;
    assert_eq!(raised, doc(&console.saga(waiting).await.unwrap()));
    assert_eq!(
        raised["spending"]["budget"],
        json!({"tokens_out": 1000}),
        "{raised}"
    );
    assert_eq!(raised["spending"]["spent"], Value::Null, "{raised}");
    pump(&store, &engine, &[waiting]).await;
    let done = query::get(&store, waiting).await.unwrap().unwrap();
    assert_eq!(done.state.as_str(), "completed", "{:?}", done.error);
    let after = api.ok(&format!("/api/v1/sagas/{waiting}")).await;
    assert_eq!(after["spending"]["usage"]["tokens_out"], 300, "{after}");
    assert_eq!(after["spending"]["waiting_for_raise"], false, "{after}");
    store.close().await;
}
