//! Dead letters by id, and by pages bounded in bytes.

use agentsaga_console::Console;
use agentsaga_console::http::HttpConfig;
use agentsaga_core::queue::DeadLetter;
use agentsaga_core::testing::{self, Backend, fresh_url};
use agentsaga_core::{Message, Store};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::server::*;

pub(crate) async fn dead_letters_are_paged_by_bytes(backend: Backend) {
    let store = Store::connect(&fresh_url(backend).await)
        .await
        .expect("connect");
    // Six dead letters of 900 KiB each: 5.3 MiB, over one page's 4 MiB.
    let big = "x".repeat(900 * 1024);
    let mut tx = store.begin().await.expect("begin");
    let mut ids = Vec::new();
    for i in 0..6 {
        let m = Message::to("big")
            .json(&json!({"i": i, "blob": big}))
            .expect("json");
        ids.push(m.id.to_string());
        tx.enqueue(&m).await.expect("enqueue");
    }
    tx.commit().await.expect("commit");
    let claimed = testing::claim(&store, &["big".to_owned()], 10).await;
    let dead: Vec<DeadLetter> = claimed
        .iter()
        .map(|e| DeadLetter {
            seq: e.seq,
            reason: "too big to care".into(),
            notice: None,
        })
        .collect();
    store.queue().dead_letter("t", &dead).await.expect("dead");
    let console = Console::new(store.clone());
    let api = Api::console(&console, HttpConfig::default()).await;

    // Pages by `before` until the last: each under 4 MiB and one row, all six once.
    let mut seen = Vec::new();
    let mut path = "/api/v1/dead?limit=1000".to_owned();
    for _ in 0..10 {
        let page = api.ok(&path).await;
        let rows = page["dead_letters"].as_array().expect("rows");
        assert!(!rows.is_empty(), "{path}");
        assert!(
            rows.len() < 6,
            "a page stops at its bytes: {} rows",
            rows.len()
        );
        let bytes = page.to_string().len();
        assert!(bytes < 4 * 1024 * 1024 + 1024 * 1024, "{bytes} bytes");
        seen.extend(rows.iter().map(|r| r["id"].as_str().unwrap().to_owned()));
        match page["next_before"].as_i64() {
            Some(before) => path = format!("/api/v1/dead?limit=1000&before={before}"),
            None => break,
        }
    }
    let mut expected = ids.clone();
    expected.reverse();
    assert_eq!(seen, expected, "newest first, each once");
    let (status, body) = api.get("/api/v1/dead?before=x").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // One by id; every one re-driven, a batch at a time.
    let oldest = api.ok(&format!("/api/v1/dead/{}", ids[0])).await;
    assert_eq!(oldest["payload"]["i"], 0);
    let all = api.ok_post("/api/v1/dead/redrive", Value::Null).await;
    assert_eq!(all["redriven"], 6, "{all}");
    assert_eq!(store.admin().stats().await.expect("stats").dead, 0);
    store.close().await;
}
