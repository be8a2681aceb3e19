//! The admin HTTP API, `/api/v1`: the console's documents as JSON.

use axum::Router;

use crate::http::AppState;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
}
