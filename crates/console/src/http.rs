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

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::{OriginalUri, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

use crate::Console;
use crate::api::ApiError;

mod guard;

/// The cookie that carries a browser's token.
pub const TOKEN_COOKIE: &str = "agentsaga_token";

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
    /// Host names the console is reached by, besides IP addresses and `localhost`
    /// (e.g. `console.internal`; a port, if given, is ignored). A request whose `Host`
    /// is none of them is refused with 421: a page whose name was rebound to this
    /// address (DNS rebinding) cannot read or act.
    pub allowed_hosts: Vec<String>,
}

impl HttpConfig {
    /// Whether any token is configured (then every request needs one).
    pub fn requires_token(&self) -> bool {
        self.read_token.is_some() || self.action_token.is_some()
    }

    /// What `token` may do: [`Access::Act`] for the action token, [`Access::Read`] for
    /// the read token, `None` for anything else (an empty token matches nothing).
    /// Compared in constant time.
    fn access(&self, token: &str) -> Option<Access> {
        let act = self
            .action_token
            .as_deref()
            .is_some_and(|t| same(t.as_bytes(), token.as_bytes()));
        let read = self
            .read_token
            .as_deref()
            .is_some_and(|t| same(t.as_bytes(), token.as_bytes()));
        if token.is_empty() {
            None
        } else if act {
            Some(Access::Act)
        } else if read {
            Some(Access::Read)
        } else {
            None
        }
    }
}

/// What a request may do, as the token check decided; in every request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// No token is configured: everything.
    Open,
    /// The read token: `GET` only.
    Read,
    /// The action token: everything.
    Act,
}

impl Access {
    /// Whether the request may act (anything but `GET` and `HEAD`).
    pub(crate) fn may_act(self) -> bool {
        self != Access::Read
    }
}

/// What every handler gets.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) console: Console,
    pub(crate) config: Arc<HttpConfig>,
}

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
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
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

/// The token check, before anything else: see the module documentation.
async fn authorize(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let config = &state.config;
    if !config.requires_token() {
        req.extensions_mut().insert(Access::Open);
        return next.run(req).await;
    }
    let api = req.uri().path().starts_with("/api/");
    let reading = matches!(*req.method(), Method::GET | Method::HEAD);
    if reading && let Some((token, rest)) = token_in_query(req.uri().query()) {
        if config.access(&token).is_none() {
            return unauthorized(api, "wrong token");
        }
        let path = req
            .extensions()
            .get::<OriginalUri>()
            .map_or_else(|| req.uri().path().to_owned(), |o| o.path().to_owned());
        let location = if rest.is_empty() {
            path
        } else {
            format!("{path}?{rest}")
        };
        return token_cookie_redirect(&token, &location);
    }
    let presented = match bearer(req.headers()) {
        Bearer::Token(t) => Some(t),
        Bearer::Malformed => return unauthorized(api, "malformed Authorization header"),
        // The API never takes the ambient cookie (see the module documentation).
        Bearer::Absent if api => None,
        Bearer::Absent => cookie(req.headers()),
    };
    let Some(token) = presented else {
        return unauthorized(api, "a token is required");
    };
    let Some(access) = config.access(&token) else {
        return unauthorized(api, "wrong token");
    };
    if !reading && !access.may_act() {
        let msg = "the read token may only read: acting needs the action token";
        return if api {
            ApiError::forbidden(msg).into_response()
        } else {
            (StatusCode::FORBIDDEN, plain(msg)).into_response()
        };
    }
    req.extensions_mut().insert(access);
    next.run(req).await
}

fn unauthorized(api: bool, why: &str) -> Response {
    let mut res = if api {
        ApiError::unauthorized(format!(
            "{why}: send `Authorization: Bearer <token>` (a read or an action token; the \
             API does not take the page's cookie)"
        ))
        .into_response()
    } else {
        (
            StatusCode::UNAUTHORIZED,
            plain(&format!(
                "{why}: open this page once with `?token=<token>` (a read or an action \
                 token) to sign in"
            )),
        )
            .into_response()
    };
    res.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"agentsaga\""),
    );
    res
}

fn plain(text: &str) -> ([(header::HeaderName, &'static str); 1], String) {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{text}\n"),
    )
}

/// `303 See Other` to `location`, setting the token cookie.
fn token_cookie_redirect(token: &str, location: &str) -> Response {
    let cookie = format!(
        "{TOKEN_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
        percent_encode(token)
    );
    let (Ok(cookie), Ok(location)) = (
        HeaderValue::from_str(&cookie),
        HeaderValue::from_str(location),
    ) else {
        return (StatusCode::BAD_REQUEST, plain("malformed address")).into_response();
    };
    let mut res = StatusCode::SEE_OTHER.into_response();
    res.headers_mut().insert(header::SET_COOKIE, cookie);
    res.headers_mut().insert(header::LOCATION, location);
    res
}

/// The `token` parameter of a query string (decoded) and the rest of the query string
/// (as it was), if there is one.
fn token_in_query(query: Option<&str>) -> Option<(String, String)> {
    let mut token = None;
    let mut rest = Vec::new();
    for pair in query?.split('&') {
        match pair.split_once('=') {
            Some(("token", v)) => token = Some(percent_decode(v).unwrap_or_default()),
            _ if pair == "token" => token = Some(String::new()),
            _ => rest.push(pair),
        }
    }
    token.map(|t| (t, rest.join("&")))
}

enum Bearer {
    Absent,
    Malformed,
    Token(String),
}

fn bearer(headers: &HeaderMap) -> Bearer {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Bearer::Absent;
    };
    let Ok(value) = value.to_str() else {
        return Bearer::Malformed;
    };
    match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => {
            Bearer::Token(token.trim().to_owned())
        }
        _ => Bearer::Malformed,
    }
}

fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| {
            let (name, value) = c.trim().split_once('=')?;
            (name == TOKEN_COOKIE).then(|| percent_decode(value))?
        })
}

/// Equal, in time that depends only on the lengths.
fn same(expected: &[u8], given: &[u8]) -> bool {
    let mut diff = expected.len() ^ given.len();
    for (i, e) in expected.iter().enumerate() {
        diff |= usize::from(e ^ given.get(i).copied().unwrap_or(0));
    }
    std::hint::black_box(diff) == 0
}

/// Every byte but ASCII letters, digits and `-._~` as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `%XX` and `+` decoded, as in a query string; `None` if malformed or not UTF-8.
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        let c = HttpConfig {
            read_token: Some("r34d".into()),
            action_token: Some("4ct".into()),
            ..HttpConfig::default()
        };
        assert_eq!(c.access("4ct"), Some(Access::Act));
        assert_eq!(c.access("r34d"), Some(Access::Read));
        for wrong in ["", "4c", "4ctt", "r34", "R34D", "x"] {
            assert_eq!(c.access(wrong), None, "{wrong}");
        }
        let empty = HttpConfig {
            action_token: Some(String::new()),
            ..HttpConfig::default()
        };
        assert!(empty.requires_token());
        assert_eq!(empty.access(""), None, "an empty token matches nothing");
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd") && !same(b"abc", b"ab") && !same(b"", b"a"));
    }

    #[test]
    fn query_and_cookies() {
        assert_eq!(
            token_in_query(Some("a=1&token=x%2By&b=2")),
            Some(("x+y".into(), "a=1&b=2".into()))
        );
        assert_eq!(token_in_query(Some("a=1")), None);
        assert_eq!(token_in_query(None), None);
        let t = "to ken;=%é";
        assert_eq!(percent_decode(&percent_encode(t)).as_deref(), Some(t));
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=b; agentsaga_token=x%20y; c=d"),
        );
        assert_eq!(cookie(&h).as_deref(), Some("x y"));
    }
}
