//! The console over HTTP: the admin API under `/api/v1` (`api.rs`) and the web page at
//! `/` (`page.rs`), one axum router over one [`Console`], mountable in an application's
//! own axum app or served by `agentsaga serve`.
//!
//! # Tokens
//!
//! With no token configured ([`HttpConfig::default`]) every request is served: only
//! bind such a router to a loopback address (`agentsaga serve` refuses anything else).
//! With a token configured every request needs one: the API's (`/api/v1`) as
//! `Authorization: Bearer T` only, the page's as that or as the `agentsaga_token`
//! cookie (so a browser can use the page: visiting any page with `?token=T` once sets
//! the cookie, `HttpOnly` and `SameSite=Strict`, and redirects to the same address
//! without the token). The API never takes the cookie: a page elsewhere could make the
//! browser send it. The read token may only `GET` (anything else with it is a 403);
//! the action token may do everything. A missing or wrong token is a 401, and nothing
//! is done.
//!
//! # Hosts and other sites
//!
//! Before the token, every request is checked (`guard.rs`): a `Host` that is not an
//! IP address, `localhost` or one of [`HttpConfig::allowed_hosts`] is a 421 (a DNS
//! rebinding page), and a request that acts from another site (`Origin`,
//! `Sec-Fetch-Site`) is a 403, or, at the API without `Content-Type:
//! application/json`, a 415. Nothing is done for any of them.
//!
//! The files: the router's state and configuration (`http/state.rs`), the token check
//! (`http/token.rs`), the host and site guard (`http/guard.rs`), how an error is
//! answered (`http/error.rs`), percent-encoding (`http/encoding.rs`).

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::middleware;

use crate::Console;

pub(crate) mod encoding;
pub(crate) mod error;
mod guard;
pub(crate) mod state;
mod token;

use state::AppState;
pub use state::HttpConfig;
pub use token::TOKEN_COOKIE;

/// The admin API and the web page over `console`, behind the token check of `config`
/// (see the [module](self) documentation).
pub fn router(console: Console, config: HttpConfig) -> Router {
    let state = AppState {
        console,
        config: Arc::new(config),
    };
    Router::new()
        .nest("/api/v1", crate::api::routes())
        .merge(crate::page::routes())
        .layer(middleware::from_fn_with_state(
            state.clone(),
            token::authorize,
        ))
        // Outermost: the host and the site are checked before the token.
        .layer(middleware::from_fn_with_state(state.clone(), guard::guard))
        .with_state(state)
}

/// Serves `app` (e.g. a [`router`]) on `listener` until `shutdown` completes, then
/// lets the requests under way finish.
///
/// # Errors
/// The listener's I/O errors.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
