//! The checks every request passes before its token is looked at: the `Host` it was
//! sent to (against DNS rebinding) and, for anything but `GET` and `HEAD`, where it
//! comes from (against cross-site requests). See `docs/console.md` for the threat model.
//!
//! - **Host.** A browser sends the name in its address bar as `Host`. A page at
//!   `evil.example` whose DNS record is switched to `127.0.0.1` (DNS rebinding) reaches
//!   the console as its own origin, so the browser lets it read the answers; its
//!   requests still say `Host: evil.example`. So only these hosts are answered: an IP
//!   address (no name to rebind), `localhost`, and the names configured in
//!   [`HttpConfig::allowed_hosts`]. Anything else is a `421 Misdirected Request`, on
//!   every route, reads included.
//! - **Cross-site.** A page elsewhere can make the operator's browser send a `POST`
//!   here (a form, or `fetch` with `mode: "no-cors"`) without reading the answer: a
//!   purge, a redrive, an abort would be done. Such a request is refused (403) when
//!   the browser says it comes from anywhere but this origin: `Sec-Fetch-Site` other
//!   than `same-origin` (or `none`, a person's own navigation), or an `Origin` that is
//!   not `http(s)://<Host>` (`null` included). `same-site` is refused too: another port
//!   of `localhost` is the same site. On top of that, an API request that is not a
//!   `GET` must say `Content-Type: application/json` (415 otherwise), which no page
//!   elsewhere can send without the browser asking first (a CORS preflight, which the
//!   console never grants), whatever the browser's age; and the API takes its token
//!   from the `Authorization` header only, never from the page's cookie
//!   (`token.rs`).
//!
//! A client that is not a browser (curl, a script) sends no `Origin` and is not a
//! browser being tricked: it passes, with its token where one is configured.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, plain};
use super::state::{AppState, HttpConfig};

/// The guard, before the token check (`http::router` layers it outside).
pub(super) async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let api = req.uri().path().starts_with("/api/");
    let host = host_of(&req);
    let Some(host) = host.filter(|h| allowed_host(&state.config, h)) else {
        let shown = host_of(&req).unwrap_or_default();
        let msg = format!(
            "refused: this console does not answer to the host `{shown}`: it answers to \
             IP addresses, `localhost` and its configured names (`--allow-host`); nothing \
             was done"
        );
        return refuse(api, StatusCode::MISDIRECTED_REQUEST, "misdirected", &msg);
    };
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return next.run(req).await;
    }
    if let Some(why) = cross_site(req.headers(), &host) {
        let msg = format!("refused: {why}; nothing was done");
        return refuse(api, StatusCode::FORBIDDEN, "cross_site", &msg);
    }
    if api && !is_json(req.headers()) {
        return refuse(
            api,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "refused: an API request that acts must say `Content-Type: application/json` \
             (its body may be empty); nothing was done",
        );
    }
    next.run(req).await
}

fn refuse(api: bool, status: StatusCode, kind: &'static str, msg: &str) -> Response {
    if api {
        ApiError::new(status, kind, msg).into_response()
    } else {
        (status, plain(msg)).into_response()
    }
}

/// The request's `Host` (with its port), or the authority of its URI (HTTP/2).
fn host_of(req: &Request) -> Option<String> {
    match req.headers().get(header::HOST) {
        Some(h) => h.to_str().ok().map(str::to_owned),
        None => req.uri().authority().map(|a| a.as_str().to_owned()),
    }
}

/// `Host` without its port: `[::1]:7070` is `[::1]`, `localhost:7070` is `localhost`.
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    host.rsplit_once(':')
        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
        .map_or(host, |(name, _)| name)
}

/// Whether the console answers to `host` (a `Host` header, with or without a port).
fn allowed_host(config: &HttpConfig, host: &str) -> bool {
    let name = host_name(host);
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return false;
    }
    let ip = name.parse::<std::net::Ipv4Addr>().is_ok()
        || name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .is_some_and(|n| n.parse::<std::net::Ipv6Addr>().is_ok());
    ip || name.eq_ignore_ascii_case("localhost")
        || config
            .allowed_hosts
            .iter()
            .any(|a| host_name(a.trim()).eq_ignore_ascii_case(name))
}

/// Why a request that acts looks like it comes from another site, if it does.
fn cross_site(headers: &HeaderMap, host: &str) -> Option<&'static str> {
    if let Some(site) = headers.get("sec-fetch-site") {
        match site.to_str() {
            Ok(s) if s.eq_ignore_ascii_case("same-origin") || s.eq_ignore_ascii_case("none") => {}
            _ => return Some("the browser says the request came from another site"),
        }
    }
    let origin = headers.get(header::ORIGIN)?;
    let same = origin.to_str().is_ok_and(|o| {
        o.strip_prefix("http://")
            .or_else(|| o.strip_prefix("https://"))
            .is_some_and(|o| o.eq_ignore_ascii_case(host))
    });
    (!same).then_some("the request's Origin is not this console")
}

/// Whether the body is declared JSON: `application/json`, parameters allowed.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn hosts() {
        let config = HttpConfig {
            allowed_hosts: vec!["console.internal".into(), "ops.example:8443".into()],
            ..HttpConfig::default()
        };
        for ok in [
            "127.0.0.1:7070",
            "127.0.0.1",
            "10.1.2.3:80",
            "[::1]:7070",
            "[::1]",
            "localhost:7070",
            "LOCALHOST",
            "localhost.",
            "console.internal",
            "Console.Internal:7070",
            "ops.example",
        ] {
            assert!(allowed_host(&config, ok), "{ok}");
        }
        for bad in [
            "",
            ":7070",
            "evil.example:7070",
            "localhost.evil.example",
            "console.internal.evil.example",
            "127.0.0.1.evil.example",
            "[::1",
            "[evil]:80",
            "sub.localhost",
        ] {
            assert!(!allowed_host(&config, bad), "{bad}");
        }
    }

    #[test]
    fn origins_and_content_types() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, HeaderValue::from_static(v));
            }
            h
        };
        let host = "127.0.0.1:7070";
        assert_eq!(cross_site(&headers(&[]), host), None);
        assert_eq!(
            cross_site(
                &headers(&[
                    ("origin", "http://127.0.0.1:7070"),
                    ("sec-fetch-site", "same-origin")
                ]),
                host
            ),
            None
        );
        for bad in [
            &[("origin", "http://127.0.0.1:7071")][..],
            &[("origin", "null")],
            &[("origin", "http://evil.example")],
            &[("sec-fetch-site", "same-site")],
            &[("sec-fetch-site", "cross-site")],
            &[
                ("origin", "http://evil.example"),
                ("sec-fetch-site", "same-origin"),
            ],
        ] {
            assert!(cross_site(&headers(bad), host).is_some(), "{bad:?}");
        }
        assert!(is_json(&headers(&[("content-type", "application/json")])));
        assert!(is_json(&headers(&[(
            "content-type",
            "Application/JSON; charset=utf-8"
        )])));
        assert!(!is_json(&headers(&[("content-type", "text/plain")])));
        assert!(!is_json(&headers(&[(
            "content-type",
            "application/json-patch+json"
        )])));
        assert!(!is_json(&headers(&[])));
    }
}
