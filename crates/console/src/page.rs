//! The web page: server-rendered HTML over the console's calls.

use axum::Router;

use crate::http::AppState;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
}
