//! The console over HTTP: the admin API under `/api/v1` (`api.rs`) and the web page at
//! `/` (`page.rs`), one axum router over one [`Console`], mountable in an application's
//! own axum app or served by `agentsaga serve`.

use std::sync::Arc;

use axum::Router;

use crate::Console;

/// How the router is served: tokens, links.
#[derive(Debug, Clone, Default)]
pub struct HttpConfig {
    /// Bearer token that may read (status, lists, one saga, dead letters).
    pub read_token: Option<String>,
    /// Bearer token that may read and act (abort, retry, skip, signal, redrive,
    /// purge, start).
    pub action_token: Option<String>,
    /// Base URL of Jaeger's UI, for the link to a saga's trace (e.g.
    /// `http://127.0.0.1:16686`).
    pub jaeger_url: Option<String>,
}

/// What every handler gets.
#[derive(Clone)]
#[allow(dead_code)] // read by the API's and the page's handlers, being written
pub(crate) struct AppState {
    pub(crate) console: Console,
    pub(crate) config: Arc<HttpConfig>,
}

/// The admin API and the web page over `console`.
pub fn router(console: Console, config: HttpConfig) -> Router {
    let state = AppState {
        console,
        config: Arc::new(config),
    };
    Router::new()
        .nest("/api/v1", crate::api::routes())
        .merge(crate::page::routes())
        .with_state(state)
}
