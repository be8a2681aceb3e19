//! Schedules: the round trip (create, list, get, pause, resume, put, delete), the
//! errors (an invalid one with its reason, a duplicate, an unknown one), the writes
//! refused to the read token and to another site, and `Runtime::admin_router` checking
//! them against its sagas and firing them.

use std::time::Duration;

use agentsaga_console::http::HttpConfig;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_saga::{Saga, Step};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::fixture::*;
use crate::server::*;
use crate::starts::Stock;

/// The schedule names of `GET /schedules`.
async fn names(api: &Api) -> Vec<String> {
    let list = api.ok("/api/v1/schedules").await;
    list["schedules"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| s["name"].as_str().expect("a name").to_owned())
        .collect()
}

pub(crate) async fn schedules_round_trip(backend: Backend) {
    let f = prepare(backend).await;
    let api = Api::console(&f.console, HttpConfig::default()).await;
    let list = api.ok("/api/v1/schedules").await;
    assert_eq!(list, doc(&f.console.schedules().await.unwrap()));
    assert_eq!(names(&api).await, [NIGHTLY]);

    let brief = json!({
        "name": "brief", "saga": "waits", "cron": "0 7 * * MON-FRI",
        "time_zone": "Europe/Paris", "input": {"at": {"$fire_time": "rfc3339"}},
        "overlap": "queue_one", "catch_up": "all:3", "late_after_ms": 120_000,
        "jitter_ms": 30_000,
    });
    let created = api.ok_post("/api/v1/schedules", brief.clone()).await;
    for (field, want) in [
        ("name", json!("brief")),
        ("saga", json!("waits")),
        ("cron", json!("0 7 * * MON-FRI")),
        ("time_zone", json!("Europe/Paris")),
        ("input", json!({"at": {"$fire_time": "rfc3339"}})),
        ("overlap", json!("queue_one")),
        ("catch_up", json!({"policy": "all", "max": 3})),
        ("late_after", json!(120_000)),
        ("jitter", json!(30_000)),
        ("paused", json!(false)),
        ("fired", json!(0)),
        ("skipped", json!(0)),
        ("last_fired", Value::Null),
        ("last_error", Value::Null),
    ] {
        assert_eq!(created[field], want, "{field}: {created}");
    }
    let (slot, due) = (
        created["next_slot_ms"].as_i64().expect("a next slot"),
        created["next_due_ms"].as_i64().expect("a due time"),
    );
    assert!(slot <= due && due <= slot + 30_000, "{created}");
    assert_eq!(
        created["next_due"],
        json!(agentsaga_console::time::rfc3339(due))
    );
    let got = api.ok("/api/v1/schedules/brief").await;
    assert_eq!(got, created);
    assert_eq!(got, doc(&f.console.schedule("brief").await.unwrap()));
    assert_eq!(names(&api).await, ["brief", NIGHTLY], "by name");

    let paused = api
        .ok_post("/api/v1/schedules/brief/pause", Value::Null)
        .await;
    assert_eq!(paused["paused"], true, "{paused}");
    let again = api
        .ok_post("/api/v1/schedules/brief/pause", Value::Null)
        .await;
    assert_eq!(again, paused, "pausing a paused schedule changes nothing");
    let resumed = api
        .ok_post("/api/v1/schedules/brief/resume", Value::Null)
        .await;
    assert_eq!(resumed["paused"], false, "{resumed}");

    // PUT replaces it whole: what the body leaves out is back to its default.
    let (status, put) = api
        .send_json(
            Method::PUT,
            "/api/v1/schedules/brief",
            json!({"saga": "waits", "cron": "*/5 * * * *", "paused": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{put}");
    assert_eq!(put["cron"], "*/5 * * * *");
    assert_eq!(put["time_zone"], "UTC");
    assert_eq!(put["overlap"], "skip");
    assert_eq!(put["catch_up"], json!({"policy": "none"}));
    assert_eq!(put["input"], Value::Null);
    assert_eq!(put["paused"], true);
    assert_eq!(
        put["created_ms"], created["created_ms"],
        "the same schedule"
    );
    // … and creates one that is not there.
    // (`late_after` as the document names it, for `late_after_ms`.)
    let extra = json!({"name": "extra", "saga": "trip", "cron": "0 0 1 * *", "late_after": 5000});
    let (status, made) = api
        .send_json(Method::PUT, "/api/v1/schedules/extra", extra)
        .await;
    assert_eq!(status, StatusCode::OK, "{made}");
    assert_eq!(made["late_after"], 5000, "{made}");
    assert_eq!(names(&api).await, ["brief", "extra", NIGHTLY]);

    let (status, deleted) = api
        .send_json(Method::DELETE, "/api/v1/schedules/extra", Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{deleted}");
    assert_eq!(deleted, made, "the schedule as it was");
    assert_eq!(names(&api).await, ["brief", NIGHTLY]);

    // Errors: typed, with the reason, and nothing written.
    let before = everything(&f).await;
    let bad = |cron: &str, tz: &str| json!({"name": "bad", "saga": "trip", "cron": cron, "time_zone": tz});
    for (body, status, kind, says) in [
        (
            bad("0 25 * * *", "UTC"),
            StatusCode::BAD_REQUEST,
            "invalid",
            "invalid schedule `bad`",
        ),
        (
            bad("0 3 * * *", "Mars/Olympus"),
            StatusCode::BAD_REQUEST,
            "invalid",
            "Mars/Olympus",
        ),
        (
            json!({"name": "bad", "saga": "trip", "cron": "* * * * *", "jitter_ms": 90_000_000}),
            StatusCode::BAD_REQUEST,
            "invalid",
            "jitter",
        ),
        (
            brief.clone(),
            StatusCode::CONFLICT,
            "refused",
            "exists already",
        ),
        (
            json!({"saga": "trip", "cron": "* * * * *"}),
            StatusCode::BAD_REQUEST,
            "invalid",
            "`name`",
        ),
        (
            json!({"name": "x", "saga": "trip", "cron": "* * * * *", "overlap": "sometimes"}),
            StatusCode::BAD_REQUEST,
            "invalid",
            "overlap",
        ),
        (
            json!({"name": "x", "saga": "trip", "cron": "* * * * *", "catch_up": "all:x"}),
            StatusCode::BAD_REQUEST,
            "invalid",
            "catch_up",
        ),
        (
            json!({"name": "x", "saga": "trip", "cron": "* * * * *", "every": 5}),
            StatusCode::BAD_REQUEST,
            "invalid",
            "every",
        ),
    ] {
        let got = api.post("/api/v1/schedules", body.clone()).await;
        assert_error(&got, status, kind, &body.to_string());
        let message = got.1["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{says}: {message}");
    }
    let renamed = json!({"name": "other", "saga": "trip", "cron": "* * * * *"});
    assert_error(
        &api.send_json(Method::PUT, "/api/v1/schedules/brief", renamed)
            .await,
        StatusCode::BAD_REQUEST,
        "invalid",
        "a PUT renaming it",
    );
    for (method, path) in [
        (Method::GET, "/api/v1/schedules/none"),
        (Method::POST, "/api/v1/schedules/none/pause"),
        (Method::POST, "/api/v1/schedules/none/resume"),
        (Method::DELETE, "/api/v1/schedules/none"),
        (Method::DELETE, "/api/v1/schedules/extra"),
    ] {
        let got = api.send_json(method.clone(), path, Value::Null).await;
        assert_error(&got, StatusCode::NOT_FOUND, "not_found", path);
    }
    assert_error(
        &api.get("/api/v1/schedules/brief/pause").await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "GET on an action",
    );
    assert_error(
        &api.get("/api/v1/schedules?saga=trip").await,
        StatusCode::BAD_REQUEST,
        "invalid",
        "a parameter",
    );
    assert_eq!(everything(&f).await, before, "nothing was written");
}

/// Each write of a schedule: method, path, body.
fn writes() -> Vec<(Method, String, Value)> {
    let body = json!({"name": "sneaky", "saga": "trip", "cron": "* * * * *"});
    vec![
        (Method::POST, "/api/v1/schedules".to_owned(), body.clone()),
        (Method::PUT, format!("/api/v1/schedules/{NIGHTLY}"), body),
        (
            Method::POST,
            format!("/api/v1/schedules/{NIGHTLY}/pause"),
            Value::Null,
        ),
        (
            Method::POST,
            format!("/api/v1/schedules/{NIGHTLY}/resume"),
            Value::Null,
        ),
        (
            Method::DELETE,
            format!("/api/v1/schedules/{NIGHTLY}"),
            Value::Null,
        ),
    ]
}

pub(crate) async fn schedule_writes_are_guarded(backend: Backend) {
    let f = prepare(backend).await;
    let before = everything(&f).await;
    let config = HttpConfig {
        read_token: Some("read-me".into()),
        action_token: Some("act".into()),
        ..HttpConfig::default()
    };
    let anon = Api::console(&f.console, config).await;
    let reader = anon.with_token(Some("read-me"));
    for (method, path, body) in writes() {
        let got = anon.send_json(method.clone(), &path, body.clone()).await;
        assert_error(&got, StatusCode::UNAUTHORIZED, "unauthorized", &path);
        let got = reader.send_json(method.clone(), &path, body).await;
        assert_error(&got, StatusCode::FORBIDDEN, "forbidden", &path);
    }
    reader.ok("/api/v1/schedules").await;
    reader.ok(&format!("/api/v1/schedules/{NIGHTLY}")).await;

    // Another site, tokens or not: 403 (or 415 without JSON), nothing done.
    let open = Api::console(&f.console, HttpConfig::default()).await;
    for (method, path, body) in writes() {
        for (origin, site, json) in [
            (Some("http://evil.example"), None, true),
            (None, Some("cross-site"), true),
            (Some("http://127.0.0.1:1"), Some("same-site"), true),
            (None, None, false),
        ] {
            let mut req = open.request(method.clone(), &path).body(body.to_string());
            if json {
                req = req.header("content-type", "application/json");
            }
            if let Some(o) = origin {
                req = req.header("origin", o);
            }
            if let Some(s) = site {
                req = req.header("sec-fetch-site", s);
            }
            let (status, got) = Api::send(req).await;
            let want = if json {
                (StatusCode::FORBIDDEN, "cross_site")
            } else {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            };
            assert_error(&(status, got), want.0, want.1, &format!("{method} {path}"));
        }
    }
    assert_eq!(everything(&f).await, before, "nothing was done");

    // The action token may; so may the page's own origin.
    let actor = anon.with_token(Some("act"));
    let paused = actor
        .ok_post(&format!("/api/v1/schedules/{NIGHTLY}/pause"), Value::Null)
        .await;
    assert_eq!(paused["paused"], true);
    let own = open.base.replace("http://", "");
    let req = open
        .request(Method::POST, &format!("/api/v1/schedules/{NIGHTLY}/resume"))
        .header("origin", format!("http://{own}"))
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/json");
    let (status, resumed) = Api::send(req).await;
    assert_eq!(status, StatusCode::OK, "{resumed}");
    assert_eq!(resumed["paused"], false);
}

pub(crate) async fn the_runtime_router_checks_and_fires_schedules(backend: Backend) {
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
    // Checked against the runtime's sagas: one it does not register is refused.
    let got = api
        .post(
            "/api/v1/schedules",
            json!({"name": "trips", "saga": "trip", "cron": "* * * * *"}),
        )
        .await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid", "an unknown saga");
    let message = got.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("no saga named `trip`"), "{message}");
    assert_eq!(names(&api).await, Vec::<String>::new());

    // Every second: the runtime fires it, each slot one saga under its start key.
    let every = json!({"name": "every-second", "saga": "order", "cron": "* * * * * *",
                       "input": {"at": {"$fire_time": "unix_ms"}}});
    api.ok_post("/api/v1/schedules", every).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let fired = loop {
        let s = api.ok("/api/v1/schedules/every-second").await;
        if s["fired"].as_i64().unwrap_or(0) >= 1 && !s["last_saga_id"].is_null() {
            break s;
        }
        assert!(tokio::time::Instant::now() < deadline, "never fired: {s}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(fired["last_fired"].is_string(), "{fired}");
    let id = fired["last_saga_id"].as_str().unwrap();
    let saga = api.ok(&format!("/api/v1/sagas/{id}")).await;
    assert_eq!(saga["saga"]["name"], "order", "{saga}");
    let key = saga["saga"]["key"].as_str().unwrap();
    assert!(key.starts_with("schedule:every-second:"), "{key}");
    let slot = key.rsplit(':').next().unwrap();
    assert_eq!(saga["data"]["at"].to_string(), slot, "{saga}");
    let paused = api
        .ok_post("/api/v1/schedules/every-second/pause", Value::Null)
        .await;
    assert_eq!(paused["paused"], true);
    drop(server);
    rt.shutdown().await;
}
