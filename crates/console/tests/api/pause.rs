//! Pause and resume: `POST /sagas/{id}/pause` holds a saga (who, why and when shown
//! with it), `POST /sagas/{id}/resume` lets it go on; a bad body is a 400, a refusal a
//! 409, an unknown saga a 404, nothing changed by any of them.

use agentsaga_console::http::HttpConfig;
use agentsaga_core::testing::Backend;
use agentsaga_saga::testing::pump_until;
use agentsaga_saga::{SagaId, StepState, query};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::fixture::*;
use crate::server::*;

pub(crate) async fn a_person_pauses_and_resumes_a_saga(backend: Backend) {
    let f = prepare(backend).await;
    let api = Api::console(&f.console, HttpConfig::default()).await;
    let c = &f.console;
    let store = c.store().clone();
    let pause = format!("/api/v1/sagas/{}/pause", f.running);
    let resume = format!("/api/v1/sagas/{}/resume", f.running);

    // Bad pauses and refusals change nothing.
    let before = everything(&f).await;
    for (body, why) in [
        (Value::Null, "no body"),
        (json!({}), "no reason"),
        (json!({"reason": ""}), "an empty reason"),
        (json!({"reason": "  "}), "a blank reason"),
        (json!({"reason": "x", "by": ""}), "an empty by"),
        (json!({"reason": "x", "until": "noon"}), "an unknown field"),
        (json!({"reason": 7}), "a number"),
        (json!(["x"]), "an array"),
    ] {
        let got = api.post(&pause, body).await;
        assert_error(&got, StatusCode::BAD_REQUEST, "invalid", why);
        let message = got.1["error"]["message"].as_str().unwrap().to_owned();
        match why {
            "no body" | "no reason" | "an empty reason" | "a blank reason" => {
                assert!(message.contains("`reason`"), "{why}: {message}");
            }
            "an empty by" => assert!(message.contains("`by`"), "{message}"),
            _ => {}
        }
    }
    let reason = json!({"reason": "checking the drafts"});
    for (path, status, kind) in [
        (
            format!("/api/v1/sagas/{}/pause", f.completed),
            StatusCode::CONFLICT,
            "refused",
        ),
        (
            format!("/api/v1/sagas/{}/pause", SagaId::new()),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            "/api/v1/sagas/nope/pause".to_owned(),
            StatusCode::BAD_REQUEST,
            "invalid",
        ),
        (format!("{pause}?by=me"), StatusCode::BAD_REQUEST, "invalid"),
        (resume.clone(), StatusCode::CONFLICT, "refused"),
        (
            format!("/api/v1/sagas/{}/resume", f.completed),
            StatusCode::CONFLICT,
            "refused",
        ),
        (
            format!("/api/v1/sagas/{}/resume", SagaId::new()),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
    ] {
        assert_error(&api.post(&path, reason.clone()).await, status, kind, &path);
    }
    assert_error(
        &api.get(&pause).await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "GET on pause",
    );
    assert_eq!(everything(&f).await, before, "nothing bad was written");

    // Paused: the saga as it now stands, saying who, why and when.
    let paused = api
        .ok_post(
            &pause,
            json!({"reason": "checking the drafts", "by": "ops-anna"}),
        )
        .await;
    assert_eq!(paused, doc(&c.saga(f.running).await.unwrap()));
    let p = &paused["saga"]["paused"];
    assert_eq!(p["by"], "ops-anna", "{paused}");
    assert_eq!(p["reason"], "checking the drafts", "{paused}");
    assert!(p["at_ms"].is_i64() && p["at"].is_string(), "{paused}");
    assert_eq!(paused["saga"]["state"], "running", "{paused}");
    let listed = api.ok("/api/v1/sagas").await;
    let row = listed["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == f.running.to_string().as_str())
        .unwrap()
        .clone();
    assert_eq!(row["paused"], *p, "{listed}");
    let before = everything(&f).await;
    let again = api.post(&pause, json!({"reason": "twice"})).await;
    assert_error(&again, StatusCode::CONFLICT, "refused", "paused already");
    assert_eq!(
        everything(&f).await,
        before,
        "a refused pause changes nothing"
    );
    // `by` defaults to `console`.
    let waiting = format!("/api/v1/sagas/{}/pause", f.waiting);
    let other = api.ok_post(&waiting, json!({"reason": "hold"})).await;
    assert_eq!(other["saga"]["paused"]["by"], "console", "{other}");

    // The runtime records the answer of what was sent, and sends nothing new.
    let engine = engine();
    pump_until(&store, &engine, "its first step answered", async || {
        let steps = query::steps(&store, f.running).await.unwrap();
        steps
            .first()
            .is_some_and(|s| s.state == StepState::Succeeded)
    })
    .await;
    let steps = query::steps(&store, f.running).await.unwrap();
    assert_eq!(
        steps.len(),
        1,
        "nothing new is sent while paused: {steps:?}"
    );

    // Resumed (here, where no definition is): it goes on once its runtime picks it up.
    let resumed = api.ok_post(&resume, Value::Null).await;
    assert_eq!(resumed, doc(&c.saga(f.running).await.unwrap()));
    assert_eq!(resumed["saga"]["paused"], Value::Null, "{resumed}");
    pump(&store, &engine, &[f.running]).await;
    assert_eq!(
        c.saga(f.running).await.unwrap().saga.state,
        "completed",
        "what the pause held back went out"
    );
}
