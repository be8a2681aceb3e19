//! Rewind: `POST /sagas/{id}/rewind` undoes a step and those after it, then runs the
//! saga again from it (the rewind shown with the saga: who, why, when, under way or
//! done, the steps undone); a bad body is a 400, a refusal a 409 saying why, an
//! unknown saga a 404, nothing changed by any of them.

use agentsaga_console::http::HttpConfig;
use agentsaga_core::testing::Backend;
use agentsaga_saga::testing::pump_until;
use agentsaga_saga::{SagaId, StepState, query};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::fixture::*;
use crate::server::*;

/// The keys of a rewind in a saga's document.
const REWIND_KEYS: [&str; 9] = [
    "at",
    "at_ms",
    "by",
    "done_at",
    "done_at_ms",
    "reason",
    "stage",
    "to",
    "undone",
];

fn keys(v: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = v
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

pub(crate) async fn a_person_rewinds_a_saga(backend: Backend) {
    let f = prepare(backend).await;
    let api = Api::console(&f.console, HttpConfig::default()).await;
    let c = &f.console;
    let store = c.store().clone();
    let rewind = format!("/api/v1/sagas/{}/rewind", f.running);
    let to_reserve = json!({"to": "reserve", "reason": "the wrong day was booked"});
    let completed = api.ok(&format!("/api/v1/sagas/{}", f.completed)).await;
    assert_eq!(
        completed["rewinds"],
        json!([]),
        "never rewound: {completed}"
    );

    // Bad rewinds and refusals change nothing.
    let before = everything(&f).await;
    for (body, why) in [
        (Value::Null, "no body"),
        (json!({}), "nothing"),
        (json!({"reason": "x"}), "no step"),
        (json!({"to": " ", "reason": "x"}), "a blank step"),
        (json!({"to": "reserve"}), "no reason"),
        (json!({"to": "reserve", "reason": "  "}), "a blank reason"),
        (
            json!({"to": "reserve", "reason": "x", "by": ""}),
            "an empty by",
        ),
        (
            json!({"to": "reserve", "reason": "x", "stage": 0}),
            "an unknown field",
        ),
        (json!({"to": 0, "reason": "x"}), "a number"),
        (json!(["reserve"]), "an array"),
    ] {
        let got = api.post(&rewind, body).await;
        assert_error(&got, StatusCode::BAD_REQUEST, "invalid", why);
        let message = got.1["error"]["message"].as_str().unwrap().to_owned();
        let names = match why {
            "no body" | "nothing" | "no step" | "a blank step" => "`to`",
            "no reason" | "a blank reason" => "`reason`",
            "an empty by" => "`by`",
            _ => "",
        };
        assert!(message.contains(names), "{why}: {message}");
    }
    let charge = json!({"to": "charge", "reason": "x"});
    for (path, body, status, kind, says) in [
        // `reserve` was sent and has not answered: pause, and rewind once it did.
        (
            rewind.clone(),
            to_reserve.clone(),
            StatusCode::CONFLICT,
            "refused",
            "in flight (pause the saga",
        ),
        (
            rewind.clone(),
            charge,
            StatusCode::CONFLICT,
            "refused",
            "no step `charge`",
        ),
        (
            format!("/api/v1/sagas/{}/rewind", f.completed),
            to_reserve.clone(),
            StatusCode::CONFLICT,
            "refused",
            "only a running saga",
        ),
        (
            format!("/api/v1/sagas/{}/rewind", SagaId::new()),
            to_reserve.clone(),
            StatusCode::NOT_FOUND,
            "not_found",
            "no saga",
        ),
        (
            "/api/v1/sagas/nope/rewind".to_owned(),
            to_reserve.clone(),
            StatusCode::BAD_REQUEST,
            "invalid",
            "",
        ),
        (
            format!("{rewind}?to=reserve"),
            to_reserve.clone(),
            StatusCode::BAD_REQUEST,
            "invalid",
            "",
        ),
    ] {
        let got = api.post(&path, body).await;
        assert_error(&got, status, kind, &path);
        let message = got.1["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{path}: {message}");
    }
    assert_error(
        &api.get(&rewind).await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "GET on rewind",
    );
    assert_eq!(everything(&f).await, before, "nothing bad was written");

    // Paused while `reserve` is out; once it answered, nothing is in flight.
    c.pause(f.running, "ops-anna", "checking the booking")
        .await
        .expect("pause");
    let engine = engine();
    pump_until(&store, &engine, "`reserve` answered", async || {
        let steps = query::steps(&store, f.running).await.unwrap();
        steps
            .first()
            .is_some_and(|s| s.state == StepState::Succeeded)
    })
    .await;

    // Rewound (here, where no definition is): `reserve`'s undo under way, the pause
    // over, the rewind shown with the saga; `by` defaults to `console`.
    let rewound = api.ok_post(&rewind, to_reserve.clone()).await;
    assert_eq!(rewound, doc(&c.saga(f.running).await.unwrap()));
    assert_eq!(rewound["saga"]["state"], "compensating", "{rewound}");
    assert_eq!(
        rewound["saga"]["paused"],
        Value::Null,
        "a rewind ends a pause"
    );
    let rewinds = rewound["rewinds"].as_array().expect("rewinds");
    assert_eq!(rewinds.len(), 1, "{rewound}");
    let r = &rewinds[0];
    assert_eq!(keys(r), REWIND_KEYS, "{r}");
    assert_eq!(r["to"], "reserve", "{r}");
    assert_eq!(r["stage"], 0, "{r}");
    assert_eq!(r["by"], "console", "{r}");
    assert_eq!(r["reason"], "the wrong day was booked", "{r}");
    assert!(r["at"].is_string() && r["at_ms"].is_i64(), "{r}");
    assert_eq!(r["done_at"], Value::Null, "under way: {r}");
    assert_eq!(r["undone"], json!([]), "{r}");
    let before = everything(&f).await;
    let again = api.post(&rewind, to_reserve).await;
    assert_error(&again, StatusCode::CONFLICT, "refused", "under way");
    let message = again.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("a rewind is under way"), "{message}");
    assert_eq!(
        everything(&f).await,
        before,
        "a refused rewind changes nothing"
    );

    // Its runtime undoes `reserve` and runs the saga again from it, to the end.
    pump(&store, &engine, &[f.running]).await;
    let shown = api.ok(&format!("/api/v1/sagas/{}", f.running)).await;
    assert_eq!(shown["saga"]["state"], "completed", "{shown}");
    let r = &shown["rewinds"][0];
    assert_eq!(keys(r), REWIND_KEYS, "{r}");
    assert!(
        r["done_at"].is_string() && r["done_at_ms"].is_i64(),
        "done: {r}"
    );
    assert_eq!(
        r["undone"],
        json!([{
            "idx": 0,
            "name": "reserve",
            "output": "done",
            "compensation": "done",
            "compensated_at": r["undone"][0]["compensated_at"],
            "compensated_at_ms": r["undone"][0]["compensated_at_ms"],
        }]),
        "{r}"
    );
    assert!(r["undone"][0]["compensated_at_ms"].is_i64(), "{r}");
    let steps = shown["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3, "{shown}");
    assert!(
        steps.iter().all(|s| s["attempts"] == 1),
        "`reserve` ran afresh: {shown}"
    );
}
