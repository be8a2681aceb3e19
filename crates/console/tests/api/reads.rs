//! Reads: every document equals the `Console` call's.

use agentsaga_console::SagaQuery;
use agentsaga_console::http::HttpConfig;
use agentsaga_core::MessageId;
use agentsaga_core::testing::Backend;
use agentsaga_saga::{SagaId, SagaState};
use reqwest::StatusCode;
use serde_json::Value;

use crate::fixture::*;
use crate::server::*;

pub(crate) async fn reads_equal_the_console_documents(backend: Backend) {
    let f = prepare(backend).await;
    let api = Api::console(&f.console, HttpConfig::default()).await;
    let c = &f.console;

    let status = api.ok("/api/v1/status").await;
    assert!(
        status["outbox"]["oldest_pending_age_ms"].is_u64(),
        "{status}"
    );
    assert_eq!(
        steady(status.clone()),
        steady(doc(&c.status().await.unwrap()))
    );
    assert_eq!(
        status["stalled"], 1,
        "the saga whose reply is dead: {status}"
    );
    assert_eq!(status["sagas_total"], 8, "{status}");

    // Lists, each filter.
    let all = api.ok("/api/v1/sagas").await;
    assert_eq!(all, doc(&c.sagas(&SagaQuery::default()).await.unwrap()));
    assert_eq!(all["sagas"].as_array().unwrap().len(), 8);
    assert_eq!(all["next_cursor"], Value::Null);
    let list = async |q: &str, query: SagaQuery| -> Vec<String> {
        let page = api.ok(&format!("/api/v1/sagas?{q}")).await;
        assert_eq!(page, doc(&c.sagas(&query).await.unwrap()), "{q}");
        page["sagas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let ids = |v: &[SagaId]| -> Vec<String> {
        let mut v: Vec<String> = v.iter().map(ToString::to_string).collect();
        v.sort();
        v
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let stuck = list(
        "state=stuck",
        SagaQuery {
            state: Some(SagaState::Stuck),
            ..SagaQuery::default()
        },
    )
    .await;
    assert_eq!(sorted(stuck), ids(&[f.stuck[0], f.stuck[1], f.after_pivot]));
    let keyed = list(
        "key=req-ok",
        SagaQuery {
            key: Some("req-ok".into()),
            ..SagaQuery::default()
        },
    )
    .await;
    assert_eq!(keyed, ids(&[f.completed]));
    let named = list(
        "name=waits",
        SagaQuery {
            name: Some("waits".into()),
            ..SagaQuery::default()
        },
    )
    .await;
    assert_eq!(named, ids(&[f.waiting]));
    let waiting = list(
        "waiting=true",
        SagaQuery {
            waiting: true,
            ..SagaQuery::default()
        },
    )
    .await;
    assert_eq!(waiting, ids(&[f.waiting]));
    let stalled = list(
        "stalled=true",
        SagaQuery {
            stalled: true,
            ..SagaQuery::default()
        },
    )
    .await;
    assert_eq!(stalled, ids(&[f.stalled]), "the stalled saga, and only it");
    let combined = list(
        "state=running&name=trip&stalled=false&waiting=0&key=&limit=1000",
        SagaQuery {
            state: Some(SagaState::Running),
            name: Some("trip".into()),
            limit: 1000,
            ..SagaQuery::default()
        },
    )
    .await;
    assert_eq!(sorted(combined), ids(&[f.stalled, f.running]));

    // Time ranges: Unix ms or RFC 3339; `from` inclusive, `to` exclusive. (Bounds a
    // millisecond away from the sagas: PostgreSQL keeps microseconds, and a saga's
    // `created_at_ms` is rounded.)
    let created: Vec<i64> = all["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["created_at_ms"].as_i64().unwrap())
        .collect();
    let (first, last) = (
        *created.iter().min().unwrap(),
        *created.iter().max().unwrap(),
    );
    let range = async |q: String, from: Option<i64>, to: Option<i64>| {
        let query = SagaQuery {
            created_from_ms: from,
            created_to_ms: to,
            ..SagaQuery::default()
        };
        list(&q, query).await.len()
    };
    let before_first = agentsaga_console::time::rfc3339(first - 1);
    assert_eq!(
        range(format!("from={before_first}"), Some(first - 1), None).await,
        8
    );
    assert_eq!(
        range(format!("from={}", last + 1), Some(last + 1), None).await,
        0
    );
    assert_eq!(
        range(format!("to={}", first - 1), None, Some(first - 1)).await,
        0
    );
    let after_last = agentsaga_console::time::rfc3339(last + 1).replace('Z', "+00:00");
    let q = format!("from={}&to={}", first - 1, after_last.replace('+', "%2B"));
    assert_eq!(range(q, Some(first - 1), Some(last + 1)).await, 8);
    // An unencoded `+` arrives as a space, and is read as the `+` it was.
    let q = format!("from={}&to={after_last}", first - 1);
    assert_eq!(range(q, Some(first - 1), Some(last + 1)).await, 8);

    // Cursor pages of three cover every saga once, newest first, as the whole list.
    let mut seen: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    for page_no in 0.. {
        assert!(page_no < 10, "pages never end");
        let path = match &cursor {
            Some(c) => format!("/api/v1/sagas?limit=3&cursor={c}"),
            None => "/api/v1/sagas?limit=3".to_owned(),
        };
        let page = api.ok(&path).await;
        let query = SagaQuery {
            limit: 3,
            cursor: cursor.clone(),
            ..SagaQuery::default()
        };
        assert_eq!(page, doc(&c.sagas(&query).await.unwrap()));
        let n = page["sagas"].as_array().unwrap().len();
        seen.extend(
            page["sagas"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["id"].as_str().unwrap().to_owned()),
        );
        match page["next_cursor"].as_str() {
            Some(next) => {
                assert_eq!(n, 3);
                cursor = Some(next.to_owned());
            }
            None => break,
        }
    }
    let every: Vec<String> = all["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(seen, every);

    // One saga, each kind.
    for id in [
        f.completed,
        f.compensated,
        f.stuck[0],
        f.after_pivot,
        f.stalled,
        f.waiting,
        f.running,
    ] {
        let show = api.ok(&format!("/api/v1/sagas/{id}")).await;
        assert_eq!(show, doc(&c.saga(id).await.unwrap()), "{id}");
        assert_eq!(show["saga"]["id"], id.to_string());
    }
    let show = api.ok(&format!("/api/v1/sagas/{}", f.waiting)).await;
    assert_eq!(show["saga"]["waiting_for"], "approval", "{show}");
    let show = api.ok(&format!("/api/v1/sagas/{}", f.compensated)).await;
    assert_eq!(show["saga"]["state"], "compensated");
    assert_eq!(show["steps"][0]["compensation_state"], "done", "{show}");

    // Dead letters.
    let dead = api.ok("/api/v1/dead").await;
    assert_eq!(dead, doc(&c.dead_letters(None, 0).await.unwrap()));
    assert_eq!(dead["dead_letters"].as_array().unwrap().len(), 3, "{dead}");
    let sms = api.ok("/api/v1/dead?destination=sms&limit=10").await;
    assert_eq!(sms, doc(&c.dead_letters(Some("sms"), 10).await.unwrap()));
    assert_eq!(sms["dead_letters"][0]["id"], f.dead_sms.to_string());
    let one = api.ok(&format!("/api/v1/dead/{}", f.dead_mailer)).await;
    assert_eq!(one, doc(&c.dead_letter(f.dead_mailer).await.unwrap()));
    assert_eq!(one["headers"]["trace"], "t-1");
    api.ok("/api/v1/dead?limit=1").await["dead_letters"]
        .as_array()
        .map(|d| assert_eq!(d.len(), 1))
        .unwrap();

    // Bad requests: JSON errors.
    let missing = SagaId::new();
    let invalid = [
        "/api/v1/sagas?bogus=1",
        "/api/v1/sagas?state=lost",
        "/api/v1/sagas?limit=0",
        "/api/v1/sagas?limit=1001",
        "/api/v1/sagas?limit=ten",
        "/api/v1/sagas?waiting=yes",
        "/api/v1/sagas?from=yesterday",
        "/api/v1/sagas?to=2024-13-01T00:00:00Z",
        "/api/v1/sagas?cursor=nonsense",
        "/api/v1/sagas?name=a&name=b",
        "/api/v1/sagas?name=%ZZ",
        "/api/v1/status?verbose=1",
        "/api/v1/sagas/not-a-uuid",
        "/api/v1/dead/not-a-uuid",
        "/api/v1/dead?state=dead",
        "/api/v1/dead?limit=5000",
    ];
    for path in invalid {
        assert_error(
            &api.get(path).await,
            StatusCode::BAD_REQUEST,
            "invalid",
            path,
        );
    }
    let not_found = [
        format!("/api/v1/sagas/{missing}"),
        format!("/api/v1/dead/{}", MessageId::new()),
        format!("/api/v1/dead/{}", f.completed),
        "/api/v1/nothing".to_owned(),
        "/api/v1/sagas/x/y/z".to_owned(),
    ];
    for path in &not_found {
        assert_error(
            &api.get(path).await,
            StatusCode::NOT_FOUND,
            "not_found",
            path,
        );
    }
    let delete = api
        .request(reqwest::Method::DELETE, "/api/v1/status")
        .header("content-type", "application/json");
    let (status, body) = Api::send(delete).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
    assert_eq!(body["error"]["kind"], "method_not_allowed");
}
