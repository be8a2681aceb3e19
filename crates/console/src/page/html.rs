//! Escaping, links, formatting and the page's frame. Every value that comes from the
//! database goes through [`esc`] (text and attributes) or [`pct`] (inside a URL).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// `s` escaped for HTML text and for a double- or single-quoted attribute value.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` percent-encoded for a URL path segment or query value (everything but RFC 3986's
/// unreserved characters).
pub(crate) use crate::http::encoding::percent_encode as pct;

/// A query string (`?a=1&b=2`, escaped for an attribute) from the pairs with a value;
/// empty when there is none.
pub(crate) fn query(pairs: &[(&str, Option<&str>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", pct(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        esc(&format!("?{}", parts.join("&")))
    }
}

/// A duration in ms as an operator reads it: `840 ms`, `3.2 s`, `4 min 5 s`, `15 min`,
/// `2 h 10 min`, `3 d 4 h`.
pub(crate) fn dur(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        // Two units, the smaller one left out when it is zero.
        let (big, big_unit, small, small_unit) = if ms < 3_600_000 {
            (ms / 60_000, "min", ms % 60_000 / 1000, "s")
        } else if ms < 86_400_000 {
            (ms / 3_600_000, "h", ms % 3_600_000 / 60_000, "min")
        } else {
            (ms / 86_400_000, "d", ms % 86_400_000 / 3_600_000, "h")
        };
        if small == 0 {
            format!("{big} {big_unit}")
        } else {
            format!("{big} {big_unit} {small} {small_unit}")
        }
    }
}

/// An RFC 3339 timestamp in a `<time>` element, or a dash.
pub(crate) fn when(ts: Option<&str>) -> String {
    match ts {
        Some(t) => format!("<time datetime=\"{0}\">{0}</time>", esc(t)),
        None => "<span class=\"muted\">–</span>".to_owned(),
    }
}

/// An RFC 3339 timestamp shown as its time of day (`12:34:56.789Z`), the whole of it
/// in the tooltip; or a dash.
pub(crate) fn clock(ts: Option<&str>) -> String {
    match ts {
        Some(t) => format!(
            "<time datetime=\"{0}\" title=\"{0}\">{1}</time>",
            esc(t),
            esc(t.split_once('T').map_or(t, |(_, time)| time))
        ),
        None => "<span class=\"muted\">–</span>".to_owned(),
    }
}

/// A saga state as a coloured badge.
pub(crate) fn badge(state: &str) -> String {
    format!(
        "<span class=\"badge st-{0}\" data-state=\"{0}\">{0}</span>",
        esc(state)
    )
}

/// Which entry of the navigation is the current page.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    Overview,
    Sagas,
    Dead,
    Schedules,
    None,
}

/// A whole page: the frame, the navigation, `body`.
pub(crate) fn page(status: StatusCode, title: &str, nav: Nav, body: &str) -> Response {
    let link = |n: Nav, href: &str, label: &str| {
        let current = if n == nav {
            " aria-current=\"page\""
        } else {
            ""
        };
        format!("<a href=\"{href}\"{current}>{label}</a>")
    };
    let html = format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{title} · agentsaga console</title>\n\
         <link rel=\"icon\" href=\"/assets/icon.svg\">\n\
         <link rel=\"stylesheet\" href=\"/assets/console.css\">\n\
         <script src=\"/assets/console.js\" defer></script>\n</head>\n<body>\n\
         <header class=\"top\"><a class=\"brand\" href=\"/\">agentsaga</a><nav>{}{}{}{}</nav></header>\n\
         <main>\n{body}\n</main>\n</body>\n</html>\n",
        link(Nav::Overview, "/", "Overview"),
        link(Nav::Sagas, "/sagas", "Sagas"),
        link(Nav::Dead, "/dead", "Dead letters"),
        link(Nav::Schedules, "/schedules", "Schedules"),
        title = esc(title),
    );
    html_response(status, html)
}

/// An HTML document or fragment, with the headers every page carries: no caching, no
/// framing, scripts and styles from this origin only, forms posting only here.
pub(crate) fn html_response(status: StatusCode, html: String) -> Response {
    let mut r = (status, html).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    secure(h);
    r
}

/// The security headers of every page, fragment and asset.
pub(crate) fn secure(h: &mut axum::http::HeaderMap) {
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
             connect-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
}

/// A page that says what went wrong.
pub(crate) fn error_page(status: StatusCode, message: &str) -> Response {
    let body = format!(
        "<h1>{}</h1>\n<p class=\"notice bad\" role=\"alert\">{}</p>\n<p><a href=\"/\">Overview</a></p>",
        status.canonical_reason().unwrap_or("Error"),
        esc(message)
    );
    page(status, "Error", Nav::None, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc(r#"<script>alert('x&"y')</script>"#),
            "&lt;script&gt;alert(&#39;x&amp;&quot;y&#39;)&lt;/script&gt;"
        );
    }

    #[test]
    fn percent_encodes_all_but_unreserved() {
        assert_eq!(pct("a b&c=d/é~"), "a%20b%26c%3Dd%2F%C3%A9~");
        assert_eq!(
            query(&[("name", Some("a&b")), ("key", None), ("x", Some("\""))]),
            "?name=a%26b&amp;x=%22"
        );
        assert_eq!(query(&[("key", None)]), "");
    }

    #[test]
    fn durations() {
        assert_eq!(dur(-5), "0 ms");
        assert_eq!(dur(840), "840 ms");
        assert_eq!(dur(3_240), "3.2 s");
        assert_eq!(dur(245_000), "4 min 5 s");
        assert_eq!(dur(900_000), "15 min");
        assert_eq!(dur(86_400_000), "1 d");
        assert_eq!(dur(7_800_000), "2 h 10 min");
        assert_eq!(dur(273_600_000), "3 d 4 h");
    }
}
