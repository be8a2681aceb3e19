//! The router served on 127.0.0.1, its client, and what the tests compare.

use std::time::Duration;

use agentsaga_console::http::{self, HttpConfig};
use agentsaga_console::{Console, SagaQuery};
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};

use crate::fixture::*;

/// The router over `console` served on 127.0.0.1, and a client for it.
pub(crate) struct Api {
    pub(crate) base: String,
    pub(crate) client: reqwest::Client,
    pub(crate) token: Option<String>,
    pub(crate) stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Api {
    pub(crate) async fn serve(app: axum::Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(http::serve(listener, app, async move {
            let _ = stopped.await;
        }));
        Self {
            base: format!("http://{addr}"),
            client: reqwest::Client::builder()
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
            token: None,
            stop: Some(stop),
        }
    }

    pub(crate) async fn console(console: &Console, config: HttpConfig) -> Self {
        Self::serve(http::router(console.clone(), config)).await
    }

    pub(crate) fn with_token(&self, token: Option<&str>) -> Self {
        Self {
            base: self.base.clone(),
            client: self.client.clone(),
            token: token.map(str::to_owned),
            stop: None,
        }
    }

    pub(crate) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.client.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    pub(crate) async fn send(req: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let res = req.send().await.expect("request");
        let status = res.status();
        let text = res.text().await.expect("body");
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {text}"));
        (status, body)
    }

    pub(crate) async fn get(&self, path: &str) -> (StatusCode, Value) {
        Self::send(self.request(reqwest::Method::GET, path)).await
    }

    /// `POST` with `body` as JSON (an empty body if `Value::Null`), as an API client
    /// sends it: `Content-Type: application/json` either way.
    pub(crate) async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send_json(reqwest::Method::POST, path, body).await
    }

    /// `method` with `body` as JSON, as [`post`](Self::post) sends it.
    pub(crate) async fn send_json(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        let req = self.request(method, path);
        let req = if body.is_null() {
            req.header("content-type", "application/json")
        } else {
            req.json(&body)
        };
        Self::send(req).await
    }

    pub(crate) async fn post_raw(
        &self,
        path: &str,
        body: impl Into<reqwest::Body>,
    ) -> (StatusCode, Value) {
        let req = self
            .request(reqwest::Method::POST, path)
            .header("content-type", "application/json")
            .body(body);
        Self::send(req).await
    }

    /// `GET path`: 200 with a document.
    pub(crate) async fn ok(&self, path: &str) -> Value {
        let (status, body) = self.get(path).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
        body
    }

    /// `POST path`: 200 with a document.
    pub(crate) async fn ok_post(&self, path: &str, body: Value) -> Value {
        let (status, doc) = self.post(path, body).await;
        assert_eq!(status, StatusCode::OK, "POST {path}: {doc}");
        doc
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Whatever it is, as JSON.
pub(crate) fn doc(v: &impl Serialize) -> Value {
    serde_json::to_value(v).expect("serialize")
}

/// A status document without the one field that moves by itself (the age of the
/// oldest pending row).
pub(crate) fn steady(mut status: Value) -> Value {
    status["outbox"]["oldest_pending_age_ms"] = Value::Null;
    status
}

/// `{"error": {"kind": kind, "message": …}}` with that status.
pub(crate) fn assert_error(got: &(StatusCode, Value), status: StatusCode, kind: &str, what: &str) {
    assert_eq!(got.0, status, "{what}: {}", got.1);
    assert_eq!(got.1["error"]["kind"], kind, "{what}: {}", got.1);
    assert!(
        got.1["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{what}: {}",
        got.1
    );
    assert_eq!(
        got.1.as_object().map(|o| o.len()),
        Some(1),
        "{what}: only `error`"
    );
}

/// Everything an operator sees of the database: status, every saga's document, the
/// dead letters and the schedules.
pub(crate) async fn everything(f: &Fixture) -> Value {
    let page = f
        .console
        .sagas(&SagaQuery {
            limit: 1000,
            ..SagaQuery::default()
        })
        .await
        .expect("list");
    let mut sagas = Vec::new();
    for s in &page.sagas {
        sagas.push(doc(&f
            .console
            .saga(s.id.parse().expect("id"))
            .await
            .expect("show")));
    }
    let dead = f.console.dead_letters(None, 1000).await.expect("dead");
    json!({
        "status": steady(doc(&f.console.status().await.expect("status"))),
        "sagas": sagas,
        "dead": doc(&dead),
        "schedules": doc(&f.console.schedules().await.expect("schedules")),
    })
}
