//! Attackers: another site, a rebound name; nothing done.

use agentsaga_console::http::HttpConfig;
use agentsaga_core::testing::Backend;
use reqwest::StatusCode;
use serde_json::Value;

use crate::fixture::*;
use crate::server::*;

/// Every state-changing route, with a body that would do something if taken: the path
/// and the body as a page elsewhere would post it (`text/plain`, which a browser sends
/// cross-site without asking first).
pub(crate) fn attacks(f: &Fixture) -> Vec<(String, &'static str)> {
    vec![
        (format!("/api/v1/sagas/{}/abort", f.running), ""),
        (format!("/api/v1/sagas/{}/retry", f.stuck[0]), ""),
        (format!("/api/v1/sagas/{}/skip", f.stuck[1]), ""),
        (
            format!("/api/v1/sagas/{}/budget", f.running),
            r#"{"tokens_out": 1000}"#,
        ),
        (
            format!("/api/v1/sagas/{}/pause", f.running),
            r#"{"reason": "evil"}"#,
        ),
        // The waiting saga is paused by the test: a resume would let it go on.
        (format!("/api/v1/sagas/{}/resume", f.waiting), ""),
        (
            format!("/api/v1/sagas/{}/rewind", f.running),
            r#"{"to": "reserve", "reason": "evil"}"#,
        ),
        (
            format!("/api/v1/sagas/{}/signal", f.waiting),
            r#"{"name": "approval", "data": {"ok": true}}"#,
        ),
        ("/api/v1/sagas".to_owned(), r#"{"name": "waits"}"#),
        ("/api/v1/dead/redrive".to_owned(), r#"{"force": true}"#),
        ("/api/v1/dead/purge".to_owned(), r#"{"older_than": "0s"}"#),
        (format!("/api/v1/dead/{}/redrive", f.dead_mailer), ""),
        (format!("/api/v1/dead/{}/purge", f.dead_sms), ""),
        (
            "/api/v1/schedules".to_owned(),
            r#"{"name": "evil", "saga": "trip", "cron": "* * * * *"}"#,
        ),
        (format!("/api/v1/schedules/{NIGHTLY}/pause"), ""),
        (format!("/api/v1/schedules/{NIGHTLY}/resume"), ""),
        (format!("/sagas/{}/abort", f.running), ""),
        (format!("/sagas/{}/pause", f.running), "reason=evil"),
        (format!("/sagas/{}/resume", f.waiting), ""),
        (
            format!("/sagas/{}/rewind", f.running),
            "to=reserve&reason=evil",
        ),
        (format!("/dead/{}/purge", f.dead_sms), ""),
        (format!("/schedules/{NIGHTLY}/pause"), ""),
    ]
}

/// The origin of a page elsewhere.
pub(crate) const EVIL: &str = "http://evil.example";
/// Another port of this machine: the same site, not the same origin.
pub(crate) const OTHER_PORT: &str = "http://127.0.0.1:1";

/// Headers a browser adds to a request a page elsewhere makes, and the content type
/// that page chose.
pub(crate) type Trick = (
    &'static [(&'static str, &'static str)],
    Option<&'static str>,
);

pub(crate) async fn cross_site_requests_change_nothing(backend: Backend) {
    let f = prepare(backend).await;
    // No token: loopback, as `agentsaga serve` runs by default.
    let api = Api::console(&f.console, HttpConfig::default()).await;
    let port = api.base.rsplit(':').next().unwrap().to_owned();
    // A paused saga, for the attacks that would resume it.
    f.console
        .pause(f.waiting, "ops", "held for the test")
        .await
        .expect("pause");
    let before = everything(&f).await;
    // (headers a browser adds, the content type the page elsewhere chose)
    let tricks: [Trick; 8] = [
        (&[("origin", EVIL)], Some("text/plain")),
        (
            &[("origin", EVIL), ("sec-fetch-site", "cross-site")],
            Some("text/plain;charset=UTF-8"),
        ),
        (&[("origin", EVIL)], None),
        (&[("origin", EVIL)], Some("application/json")),
        // Another port of this machine: the same site, not the same origin.
        (
            &[("origin", OTHER_PORT), ("sec-fetch-site", "same-site")],
            Some("text/plain"),
        ),
        (&[("sec-fetch-site", "same-site")], Some("application/json")),
        (
            &[("origin", "null")],
            Some("application/x-www-form-urlencoded"),
        ),
        // A browser old enough to send neither: still no JSON without asking first.
        (&[], Some("text/plain")),
    ];
    for (path, body) in attacks(&f) {
        for (headers, content_type) in &tricks {
            if path.starts_with("/api/") || !headers.is_empty() {
                let mut req = api.client.post(format!("{}{path}", api.base)).body(body);
                for (k, v) in *headers {
                    req = req.header(*k, *v);
                }
                if let Some(ct) = content_type {
                    req = req.header("content-type", *ct);
                }
                let res = req.send().await.expect("request");
                let status = res.status();
                let text = res.text().await.unwrap();
                assert!(
                    status == StatusCode::FORBIDDEN || status == StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "POST {path} {headers:?} {content_type:?}: {status} {text}"
                );
                if path.starts_with("/api/") {
                    let body: Value = serde_json::from_str(&text).expect("a JSON error");
                    let kind = body["error"]["kind"].as_str().unwrap_or_default();
                    assert!(
                        ["cross_site", "unsupported_media_type"].contains(&kind),
                        "{path}: {body}"
                    );
                }
            }
        }
    }
    assert_eq!(everything(&f).await, before, "nothing was done");

    // This console's own origin, with JSON: done.
    let own = format!("http://127.0.0.1:{port}");
    let abort = format!("/api/v1/sagas/{}/abort", f.running);
    let req = api
        .request(reqwest::Method::POST, &abort)
        .header("origin", &own)
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/json");
    let (status, body) = Api::send(req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["saga"]["state"], "compensating");
    // A client that is no browser (curl, the CLI's users) sends JSON and no Origin.
    let purge = format!("/api/v1/dead/{}/purge", f.dead_sms);
    assert_eq!(api.ok_post(&purge, Value::Null).await["purged"], 1);

    // With tokens, the API takes no ambient cookie: a page elsewhere cannot borrow it.
    let tokens = Api::console(
        &f.console,
        HttpConfig {
            read_token: Some("read-me".into()),
            action_token: Some("act".into()),
            ..HttpConfig::default()
        },
    )
    .await;
    let skip = format!("/api/v1/sagas/{}/skip", f.stuck[1]);
    let with_cookie = |method: reqwest::Method, path: &str| {
        tokens
            .client
            .request(method, format!("{}{path}", tokens.base))
            .header("cookie", "agentsaga_token=act")
            .header("content-type", "application/json")
    };
    assert_error(
        &Api::send(with_cookie(reqwest::Method::POST, &skip)).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "the cookie acting on the API",
    );
    assert_error(
        &Api::send(with_cookie(reqwest::Method::GET, "/api/v1/sagas")).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "the cookie reading the API",
    );
    assert_eq!(
        f.console.saga(f.stuck[1]).await.unwrap().saga.state,
        "stuck",
        "nothing was done"
    );
}

pub(crate) async fn rebound_hosts_are_refused(backend: Backend) {
    let f = prepare(backend).await;
    let api = Api::console(
        &f.console,
        HttpConfig {
            allowed_hosts: vec!["console.internal".into()],
            ..HttpConfig::default()
        },
    )
    .await;
    let port = api.base.rsplit(':').next().unwrap().to_owned();
    let before = everything(&f).await;
    let with_host = |method: reqwest::Method, path: &str, host: &str| {
        api.request(method, path)
            .header("host", host)
            .header("content-type", "application/json")
    };
    // A page at evil.example whose name now points at 127.0.0.1: its requests carry
    // its own name.
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("localhost.evil.example:{port}"),
        format!("console.internal.evil.example:{port}"),
        String::new(),
    ] {
        for path in ["/api/v1/sagas", "/api/v1/status", "/api/v1/dead"] {
            assert_error(
                &Api::send(with_host(reqwest::Method::GET, path, &host)).await,
                StatusCode::MISDIRECTED_REQUEST,
                "misdirected",
                &format!("{host} {path}"),
            );
        }
        for path in ["/", "/sagas", "/dead"] {
            let res = with_host(reqwest::Method::GET, path, &host)
                .send()
                .await
                .unwrap();
            assert_eq!(
                res.status(),
                StatusCode::MISDIRECTED_REQUEST,
                "{host} {path}"
            );
            assert!(!res.text().await.unwrap().contains(&f.running.to_string()));
        }
        let abort = format!("/api/v1/sagas/{}/abort", f.running);
        assert_error(
            &Api::send(with_host(reqwest::Method::POST, &abort, &host)).await,
            StatusCode::MISDIRECTED_REQUEST,
            "misdirected",
            &format!("{host} abort"),
        );
    }
    assert_eq!(everything(&f).await, before, "nothing was done");

    // The names it is reached by: loopback names and addresses, the configured ones.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("[::1]:{port}"),
        format!("console.internal:{port}"),
        "console.internal".to_owned(),
    ] {
        let (status, body) =
            Api::send(with_host(reqwest::Method::GET, "/api/v1/sagas", &host)).await;
        assert_eq!(status, StatusCode::OK, "{host}: {body}");
    }
}
