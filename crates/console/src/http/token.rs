//! The token check, before anything else but the guard: see the [module](super)
//! documentation of `http`.

use axum::extract::{OriginalUri, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::encoding::{percent_decode, percent_encode};
use super::error::{ApiError, plain};
use super::state::{Access, AppState};

/// The cookie that carries a browser's token.
pub const TOKEN_COOKIE: &str = "agentsaga_token";

/// The token check, before anything else: see the module documentation.
pub(super) async fn authorize(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
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

#[cfg(test)]
mod tests {
    use super::*;

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
