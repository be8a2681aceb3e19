//! Tokens: 401 / 403, and nothing done.

use agentsaga_console::http::HttpConfig;
use agentsaga_core::testing::Backend;
use reqwest::StatusCode;
use serde_json::Value;

use crate::fixture::*;
use crate::server::*;

pub(crate) async fn tokens_guard_everything(backend: Backend) {
    let f = prepare(backend).await;
    let config = HttpConfig {
        read_token: Some("read-me".into()),
        action_token: Some("act now".into()),
        ..HttpConfig::default()
    };
    let anon = Api::console(&f.console, config).await;
    let reader = anon.with_token(Some("read-me"));
    let actor = anon.with_token(Some("act now"));
    let wrong = anon.with_token(Some("read-me-not"));
    let before = everything(&f).await;

    // Reads: 401 without the right token, the document with either token.
    for api in [&anon, &wrong] {
        for path in ["/api/v1/status", "/api/v1/sagas", "/api/v1/nothing"] {
            let got = api.get(path).await;
            assert_error(&got, StatusCode::UNAUTHORIZED, "unauthorized", path);
        }
    }
    let res = anon
        .request(reqwest::Method::GET, "/api/v1/status")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert!(res.headers().contains_key("www-authenticate"));
    let basic = anon
        .request(reqwest::Method::GET, "/api/v1/status")
        .basic_auth("admin", Some("act now"));
    assert_error(
        &Api::send(basic).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "basic",
    );
    for api in [&reader, &actor] {
        let status = api.ok("/api/v1/status").await;
        assert_eq!(
            steady(status),
            steady(doc(&f.console.status().await.unwrap()))
        );
        assert_error(
            &api.get("/api/v1/nothing").await,
            StatusCode::NOT_FOUND,
            "not_found",
            "after the token",
        );
    }

    // Actions: 401 without, 403 with the read token; nothing done.
    let abort = format!("/api/v1/sagas/{}/abort", f.running);
    let purge = format!("/api/v1/dead/{}/purge", f.dead_sms);
    let budget = format!("/api/v1/sagas/{}/budget", f.running);
    let pause = format!("/api/v1/schedules/{NIGHTLY}/pause");
    let pause_saga = format!("/api/v1/sagas/{}/pause", f.running);
    let resume_saga = format!("/api/v1/sagas/{}/resume", f.running);
    let rewind_saga = format!("/api/v1/sagas/{}/rewind", f.running);
    for path in [
        &abort,
        &purge,
        &budget,
        &pause,
        &pause_saga,
        &resume_saga,
        &rewind_saga,
        &"/api/v1/dead/redrive".to_owned(),
    ] {
        assert_error(
            &anon.post(path, Value::Null).await,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            path,
        );
        assert_error(
            &wrong.post(path, Value::Null).await,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            path,
        );
        assert_error(
            &reader.post(path, Value::Null).await,
            StatusCode::FORBIDDEN,
            "forbidden",
            path,
        );
    }
    // Oversized or malformed bodies without a token: 401 first.
    let huge = "x".repeat(100 * 1024);
    assert_error(
        &anon.post_raw("/api/v1/dead/redrive", huge).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "huge",
    );
    assert_eq!(everything(&f).await, before, "nothing was done");
    let aborted = actor.ok_post(&abort, Value::Null).await;
    assert_eq!(aborted["saga"]["state"], "compensating");

    // A browser: `?token=` once sets the cookie and redirects without the token.
    let visit = |path: &str| anon.client.get(format!("{}{path}", anon.base)).send();
    let res = visit("/?token=act%20now").await.unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()["location"], "/");
    let cookie = res.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.starts_with("agentsaga_token=act%20now;"), "{cookie}");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    let res = visit("/sagas?state=stuck&token=read-me&limit=5")
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()["location"], "/sagas?state=stuck&limit=5");
    let res = visit("/?token=guess").await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert!(!res.headers().contains_key("set-cookie"));
    let res = visit("/").await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::UNAUTHORIZED,
        "the page needs a token too"
    );

    let with_cookie = |method: reqwest::Method, path: &str, token: &str| {
        anon.client
            .request(method, format!("{}{path}", anon.base))
            .header("cookie", format!("theme=dark; agentsaga_token={token}"))
    };
    // The API takes no cookie (a page elsewhere could make the browser send it).
    let (status, _) = Api::send(with_cookie(
        reqwest::Method::GET,
        "/api/v1/status",
        "read-me",
    ))
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let res = with_cookie(reqwest::Method::GET, "/", "read-me")
        .send()
        .await
        .unwrap();
    let page = res.status();
    assert!(
        page != StatusCode::UNAUTHORIZED && page != StatusCode::FORBIDDEN,
        "the page with the cookie: {page}"
    );
    let (status, _) = Api::send(with_cookie(reqwest::Method::GET, "/api/v1/status", "stale")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let api_skip = format!("/api/v1/sagas/{}/skip", f.stuck[1]);
    let got = Api::send(
        with_cookie(reqwest::Method::POST, &api_skip, "act%20now")
            .header("content-type", "application/json"),
    )
    .await;
    assert_error(
        &got,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "the action cookie at the API",
    );
    // The page's forms take it: the read cookie may not act, the action cookie may.
    let skip = format!("/sagas/{}/skip", f.stuck[1]);
    let res = with_cookie(reqwest::Method::POST, &skip, "read-me")
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::FORBIDDEN,
        "the read cookie acting"
    );
    assert_eq!(
        f.console.saga(f.stuck[1]).await.unwrap().saga.state,
        "stuck"
    );
    let res = with_cookie(reqwest::Method::POST, &skip, "act%20now")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        f.console.saga(f.stuck[1]).await.unwrap().saga.state,
        "compensated"
    );

    // An action token alone: it does everything; nothing without it.
    let act_only = Api::console(
        &f.console,
        HttpConfig {
            action_token: Some("only".into()),
            ..HttpConfig::default()
        },
    )
    .await;
    assert_error(
        &act_only.get("/api/v1/status").await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "none",
    );
    act_only.with_token(Some("only")).ok("/api/v1/status").await;
}
