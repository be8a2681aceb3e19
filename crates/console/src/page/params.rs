//! What the page's requests carry (their query parameters, as text), and how a failed
//! call is shown.

use axum::response::Response;
use serde::Deserialize;

use super::html::error_page;
use crate::Error;
use crate::http::encoding::percent_decode;
use crate::http::error::status_of;

/// A failed call, as a page.
pub(crate) fn fail(e: &Error) -> Response {
    error_page(status_of(e), &e.to_string())
}

/// Field `name` of a form's body (`application/x-www-form-urlencoded`), decoded; `None`
/// if it is absent or not well encoded.
pub(crate) fn form_field(body: &[u8], name: &str) -> Option<String> {
    let body = std::str::from_utf8(body).ok()?;
    body.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k)? == name)
            .then(|| percent_decode(v))
            .flatten()
    })
}

/// `GET /sagas` parameters, as text: a form sends empty fields, and a wrong value is
/// answered with a page saying which.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListParams {
    pub(crate) state: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) key: Option<String>,
    pub(crate) waiting: Option<String>,
    pub(crate) stalled: Option<String>,
    pub(crate) cursor: Option<String>,
    pub(crate) limit: Option<String>,
}

/// `?done=<action>` after an action: what the saga page says was done.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Done {
    pub(crate) done: Option<String>,
    pub(crate) id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct DeadParams {
    pub(crate) destination: Option<String>,
    pub(crate) limit: Option<String>,
}
