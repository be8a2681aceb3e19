//! Actions: each answers the saga as it now stands.

use agentsaga_console::http::HttpConfig;
use agentsaga_core::MessageId;
use agentsaga_core::testing::Backend;
use agentsaga_saga::SagaId;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::fixture::*;
use crate::server::*;

pub(crate) async fn actions_answer_the_saga_as_it_now_stands(backend: Backend) {
    let f = prepare(backend).await;
    let api = Api::console(&f.console, HttpConfig::default()).await;
    let c = &f.console;
    let state = async |id: SagaId| c.saga(id).await.unwrap().saga.state;

    // Abort, retry, skip: each answers with the saga as `sagas show` now has it.
    let cases = [
        (f.running, "abort", "compensating"),
        (f.stuck[0], "retry", "compensating"),
        (f.stuck[1], "skip", "compensated"),
        (f.after_pivot, "abort", "aborted"),
    ];
    for (id, action, after) in cases {
        let doc_ = api
            .ok_post(&format!("/api/v1/sagas/{id}/{action}"), Value::Null)
            .await;
        assert_eq!(doc_["saga"]["state"], after, "{action}: {doc_}");
        assert_eq!(doc_, doc(&c.saga(id).await.unwrap()), "{action}");
    }

    // Refused and bad ones change nothing.
    let before = everything(&f).await;
    let refused = [
        format!("/api/v1/sagas/{}/retry", f.completed),
        format!("/api/v1/sagas/{}/skip", f.compensated),
        format!("/api/v1/sagas/{}/abort", f.completed),
    ];
    for path in &refused {
        assert_error(
            &api.post(path, Value::Null).await,
            StatusCode::CONFLICT,
            "refused",
            path,
        );
    }
    let missing = SagaId::new();
    assert_error(
        &api.post(&format!("/api/v1/sagas/{missing}/abort"), Value::Null)
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
        "an unknown saga",
    );
    for path in [
        "/api/v1/sagas/nope/abort".to_owned(),
        format!("/api/v1/sagas/{}/abort?force=true", f.stalled),
    ] {
        assert_error(
            &api.post(&path, Value::Null).await,
            StatusCode::BAD_REQUEST,
            "invalid",
            &path,
        );
    }
    assert_error(
        &api.post(&format!("/api/v1/sagas/{}/cancel", f.stalled), Value::Null)
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
        "an unknown action",
    );
    assert_error(
        &api.get(&format!("/api/v1/sagas/{}/abort", f.stalled)).await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "GET on an action",
    );

    // Signals.
    let signal = format!("/api/v1/sagas/{}/signal", f.waiting);
    let bad_signals = [
        json!({"name": "approval", "data": 1, "reject": "no"}),
        json!({"name": "", "data": 1}),
        json!({"data": 1}),
        json!({"name": "approval", "extra": 1}),
        json!(["approval"]),
    ];
    for body in bad_signals {
        assert_error(
            &api.post(&signal, body.clone()).await,
            StatusCode::BAD_REQUEST,
            "invalid",
            &body.to_string(),
        );
    }
    assert_error(
        &api.post_raw(&signal, "{\"name\": ").await,
        StatusCode::BAD_REQUEST,
        "invalid",
        "malformed",
    );
    assert_error(
        &api.post_raw(&signal, "").await,
        StatusCode::BAD_REQUEST,
        "invalid",
        "empty",
    );
    assert_error(
        &api.post(&signal, json!({"name": "payment"})).await,
        StatusCode::CONFLICT,
        "refused",
        "a signal it never waits for",
    );
    assert_error(
        &api.post(
            &format!("/api/v1/sagas/{}/signal", f.completed),
            json!({"name": "approval"}),
        )
        .await,
        StatusCode::CONFLICT,
        "refused",
        "a finished saga",
    );
    assert_eq!(
        everything(&f).await,
        before,
        "nothing refused or bad was written"
    );

    let sent = api
        .ok_post(&signal, json!({"name": "approval", "data": {"by": "ann"}}))
        .await;
    assert_eq!(sent["receipt"], "recorded", "{sent}");
    let show = doc(&c.saga(f.waiting).await.unwrap());
    for k in ["saga", "data", "steps"] {
        assert_eq!(
            sent[k], show[k],
            "the signal's answer carries the saga: {k}"
        );
    }
    let again = api
        .ok_post(&signal, json!({"name": "approval", "reject": "too late"}))
        .await;
    assert_eq!(again["receipt"], "duplicate", "{again}");

    // Starting needs a runtime's definitions.
    assert_error(
        &api.post(
            "/api/v1/sagas",
            json!({"name": "trip", "data": {"case": "ok"}}),
        )
        .await,
        StatusCode::NOT_FOUND,
        "not_found",
        "start without definitions",
    );

    // Dead letters: one re-driven, one purged, moot ones refused, purge by age.
    let redriven = api
        .ok_post(&format!("/api/v1/dead/{}/redrive", f.dead_sms), Value::Null)
        .await;
    assert_eq!(
        redriven,
        json!({"id": f.dead_sms.to_string(), "outcome": "redriven", "moot": null})
    );
    assert_error(
        &api.get(&format!("/api/v1/dead/{}", f.dead_sms)).await,
        StatusCode::NOT_FOUND,
        "not_found",
        "a re-driven dead letter is pending again",
    );
    assert_error(
        &api.post(
            &format!("/api/v1/dead/{}/redrive?force=maybe", f.dead_mailer),
            Value::Null,
        )
        .await,
        StatusCode::BAD_REQUEST,
        "invalid",
        "force=maybe",
    );
    assert_error(
        &api.post(
            &format!("/api/v1/dead/{}/redrive", MessageId::new()),
            Value::Null,
        )
        .await,
        StatusCode::NOT_FOUND,
        "not_found",
        "an unknown dead letter",
    );
    let purged = api
        .ok_post(
            &format!("/api/v1/dead/{}/purge", f.dead_mailer),
            Value::Null,
        )
        .await;
    assert_eq!(purged, json!({"purged": 1}));
    assert_eq!(c.dead_letters(None, 0).await.unwrap().dead_letters.len(), 1);

    let before = everything(&f).await;
    for body in [
        json!({"older_than": "7x"}),
        json!({"older_than": 7}),
        json!({}),
        json!({"older_than": "7d", "destination": "sms"}),
    ] {
        assert_error(
            &api.post("/api/v1/dead/purge", body.clone()).await,
            StatusCode::BAD_REQUEST,
            "invalid",
            &body.to_string(),
        );
    }
    assert_error(
        &api.post("/api/v1/dead/redrive", json!({"force": "yes"}))
            .await,
        StatusCode::BAD_REQUEST,
        "invalid",
        "force: yes",
    );
    // Over 64 KiB: 413, nothing read.
    let huge = json!({"destination": "x".repeat(70 * 1024)}).to_string();
    assert_error(
        &api.post_raw("/api/v1/dead/redrive", huge).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        "huge",
    );
    assert_eq!(everything(&f).await, before, "nothing bad was written");

    assert_eq!(
        api.ok_post("/api/v1/dead/purge", json!({"older_than": "7d"}))
            .await,
        json!({"purged": 0})
    );
    assert_eq!(
        api.ok_post("/api/v1/dead/redrive", json!({"destination": "nowhere"}))
            .await,
        json!({"redriven": 0, "purged": 0, "refused": []})
    );
    // The stalled saga's dead reply: re-driven with the rest (an empty body).
    let all = api.ok_post("/api/v1/dead/redrive", Value::Null).await;
    assert_eq!(
        all,
        json!({"redriven": 1, "purged": 0, "refused": []}),
        "{all}"
    );
    assert!(
        c.dead_letters(None, 0)
            .await
            .unwrap()
            .dead_letters
            .is_empty()
    );
    assert_eq!(state(f.stalled).await, "running");
}
