//! The admin HTTP API, `/api/v1`: the console's documents as JSON.
//!
//! Every handler checks its query parameters, path and body first (an unknown
//! parameter, a bad value, a malformed id or body is a 400, a body over [`MAX_BODY`] a
//! 413, before anything is read or written), then makes exactly one [`Console`] call
//! and answers with its document, the one `agentsaga … --json` prints. Errors are
//! `{"error": {"kind": …, "message": …}}` ([`ApiError`]).
//!
//! [`Console`]: crate::Console

use std::collections::BTreeMap;

use agentsaga_core::MessageId;
use agentsaga_saga::{SagaId, SagaState, Signal};
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::http::AppState;
use crate::ops::{self, Action, SagaQuery};

/// The largest request body the API reads: 64 KiB. A larger one is a 413.
pub(crate) const MAX_BODY: usize = 64 * 1024;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/status", get(status))
        .route("/sagas", get(sagas).post(start))
        .route("/sagas/{id}", get(saga))
        .route("/sagas/{id}/abort", post(abort))
        .route("/sagas/{id}/retry", post(retry))
        .route("/sagas/{id}/skip", post(skip))
        .route("/sagas/{id}/signal", post(signal))
        .route("/dead", get(dead_letters))
        .route("/dead/redrive", post(redrive_all))
        .route("/dead/purge", post(purge_older))
        .route("/dead/{id}", get(dead_letter))
        .route("/dead/{id}/redrive", post(redrive))
        .route("/dead/{id}/purge", post(purge))
        .fallback(async || ApiError::not_found("no such endpoint (see docs/cli.md)"))
        .method_not_allowed_fallback(async || {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this endpoint does not take this method",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
}

// ---------------------------------------------------------------------------------------
// Errors

/// An API error: its status and `{"error": {"kind": …, "message": …}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }
}

impl From<ops::Error> for ApiError {
    fn from(e: ops::Error) -> Self {
        let status = match &e {
            ops::Error::NotFound(_) => StatusCode::NOT_FOUND,
            ops::Error::Refused(_) => StatusCode::CONFLICT,
            ops::Error::Invalid(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.kind(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "kind": self.kind, "message": self.message } });
        (self.status, Json(body)).into_response()
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

// ---------------------------------------------------------------------------------------
// Requests: query parameters, ids, bodies

/// The query parameters of one request: each at most once, each one the endpoint
/// knows; an empty value counts as absent.
struct Params(BTreeMap<String, String>);

impl Params {
    fn parse(raw: Option<String>, known: &[&str]) -> Result<Self, ApiError> {
        let mut params = BTreeMap::new();
        for pair in raw.as_deref().unwrap_or("").split('&') {
            if pair.is_empty() {
                continue;
            }
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (k, v) = (percent_decode(k)?, percent_decode(v)?);
            if !known.contains(&k.as_str()) {
                return Err(ApiError::invalid(if known.is_empty() {
                    format!("unknown parameter `{k}`: this endpoint takes none")
                } else {
                    format!(
                        "unknown parameter `{k}`: this endpoint takes {}",
                        known.join(", ")
                    )
                }));
            }
            if params.insert(k.clone(), v).is_some() {
                return Err(ApiError::invalid(format!("parameter `{k}` given twice")));
            }
        }
        params.retain(|_, v: &mut String| !v.is_empty());
        Ok(Self(params))
    }

    fn string(&self, k: &str) -> Option<String> {
        self.0.get(k).cloned()
    }

    fn value<T>(
        &self,
        k: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ApiError> {
        self.0
            .get(k)
            .map(|v| parse(v).map_err(|e| ApiError::invalid(format!("parameter `{k}`: {e}"))))
            .transpose()
    }

    fn flag(&self, k: &str) -> Result<bool, ApiError> {
        Ok(self.value(k, parse_bool)?.unwrap_or(false))
    }
}

fn parse_bool(v: &str) -> Result<bool, String> {
    match v {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("`{v}` is not true or false")),
    }
}

fn parse_limit(v: &str) -> Result<u32, String> {
    match v.parse::<u32>() {
        Ok(n) if (1..=ops::MAX_PAGE).contains(&n) => Ok(n),
        _ => Err(format!("`{v}` is not a number from 1 to {}", ops::MAX_PAGE)),
    }
}

fn parse_state(v: &str) -> Result<SagaState, String> {
    v.parse().map_err(|_| {
        format!(
            "unknown saga state `{v}`: expected one of running, compensating, stuck, \
             completed, compensated, aborted"
        )
    })
}

/// `%XX` and `+` decoded, as in a query string.
fn percent_decode(s: &str) -> Result<String, ApiError> {
    crate::http::percent_decode(s)
        .ok_or_else(|| ApiError::invalid(format!("malformed query string near `{s}`")))
}

fn saga_id(path: Result<Path<String>, PathRejection>) -> Result<SagaId, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::invalid(e.body_text()))?;
    Ok(ops::parse_saga_id(&id)?)
}

fn message_id(path: Result<Path<String>, PathRejection>) -> Result<MessageId, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::invalid(e.body_text()))?;
    Ok(ops::parse_message_id(&id)?)
}

/// The body as JSON of type `T`; an empty body is `T::default()` when `empty` allows it.
fn body<T: DeserializeOwned>(
    bytes: Result<Bytes, BytesRejection>,
    empty: Option<fn() -> T>,
) -> Result<T, ApiError> {
    let bytes = bytes.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("the body is over the limit of {MAX_BODY} bytes"),
            )
        } else {
            ApiError::invalid(format!("cannot read the body: {}", e.body_text()))
        }
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        if let Some(default) = empty {
            return Ok(default());
        }
        return Err(ApiError::invalid(
            "the body is empty: a JSON object is expected",
        ));
    }
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("malformed body: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid(
            "malformed body: a JSON object is expected",
        ));
    }
    serde_json::from_value(value).map_err(|e| ApiError::invalid(format!("malformed body: {e}")))
}

// ---------------------------------------------------------------------------------------
// Timestamps and durations

/// A point in time as `from` / `to` take it: Unix milliseconds (`1732281777111`) or RFC
/// 3339 (`2024-11-22T13:22:57Z`, `2024-11-22T13:22:57.111+01:00`).
fn parse_time(v: &str) -> Result<i64, String> {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return v
            .parse()
            .map_err(|_| format!("`{v}` is out of range for Unix milliseconds"));
    }
    crate::time::parse_rfc3339(v).ok_or_else(|| {
        format!(
            "`{v}` is neither Unix milliseconds nor an RFC 3339 timestamp \
             (2024-11-22T13:22:57Z)"
        )
    })
}

// ---------------------------------------------------------------------------------------
// Handlers

async fn status(State(s): State<AppState>, RawQuery(q): RawQuery) -> ApiResult<ops::StatusDoc> {
    Params::parse(q, &[])?;
    Ok(Json(s.console.status().await?))
}

const SAGA_PARAMS: &[&str] = &[
    "state", "name", "key", "waiting", "stalled", "from", "to", "cursor", "limit",
];

async fn sagas(State(s): State<AppState>, RawQuery(q): RawQuery) -> ApiResult<ops::SagaPage> {
    let p = Params::parse(q, SAGA_PARAMS)?;
    let query = SagaQuery {
        state: p.value("state", parse_state)?,
        name: p.string("name"),
        key: p.string("key"),
        waiting: p.flag("waiting")?,
        stalled: p.flag("stalled")?,
        created_from_ms: p.value("from", parse_time)?,
        created_to_ms: p.value("to", parse_time)?,
        cursor: p.string("cursor"),
        limit: p.value("limit", parse_limit)?.unwrap_or(100),
    };
    Ok(Json(s.console.sagas(&query).await?))
}

async fn saga(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
) -> ApiResult<ops::ShowDoc> {
    Params::parse(q, &[])?;
    Ok(Json(s.console.saga(saga_id(path)?).await?))
}

async fn act(
    s: AppState,
    path: Result<Path<String>, PathRejection>,
    q: Option<String>,
    action: Action,
) -> ApiResult<ops::ShowDoc> {
    Params::parse(q, &[])?;
    Ok(Json(s.console.act(saga_id(path)?, action).await?))
}

async fn abort(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
) -> ApiResult<ops::ShowDoc> {
    act(s, path, q, Action::Abort).await
}

async fn retry(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
) -> ApiResult<ops::ShowDoc> {
    act(s, path, q, Action::Retry).await
}

async fn skip(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
) -> ApiResult<ops::ShowDoc> {
    act(s, path, q, Action::Skip).await
}

/// `POST /sagas/{id}/signal`: `{"name": …, "data": …}` approves (with `data`, `null`
/// if absent), `{"name": …, "reject": "reason"}` rejects.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignalBody {
    name: String,
    #[serde(default)]
    data: Option<Value>,
    #[serde(default)]
    reject: Option<String>,
}

async fn signal(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<ops::SignalDoc> {
    Params::parse(q, &[])?;
    let id = saga_id(path)?;
    let b: SignalBody = body(bytes, None)?;
    if b.name.is_empty() {
        return Err(ApiError::invalid(
            "`name` is empty: the signal's name is needed",
        ));
    }
    let signal = match (b.data, b.reject) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "`data` approves and `reject` rejects: give one of them, not both",
            ));
        }
        (data, None) => Signal::Approve(data.unwrap_or(Value::Null)),
        (None, Some(reason)) => Signal::Reject(reason),
    };
    Ok(Json(s.console.signal(id, &b.name, signal).await?))
}

/// `POST /sagas`: `{"name": …, "data": …, "key": …}` (`data` is `null` if absent;
/// `key` is optional).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartBody {
    name: String,
    #[serde(default)]
    data: Value,
    #[serde(default)]
    key: Option<String>,
}

async fn start(
    State(s): State<AppState>,
    RawQuery(q): RawQuery,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<ops::ShowDoc> {
    Params::parse(q, &[])?;
    let b: StartBody = body(bytes, None)?;
    Ok(Json(
        s.console.start(&b.name, b.key.as_deref(), b.data).await?,
    ))
}

async fn dead_letters(
    State(s): State<AppState>,
    RawQuery(q): RawQuery,
) -> ApiResult<ops::DeadList> {
    let p = Params::parse(q, &["destination", "before", "limit"])?;
    let limit = p.value("limit", parse_limit)?.unwrap_or(100);
    let before = p.value("before", |v| {
        v.parse::<i64>()
            .map_err(|_| format!("`{v}` is not a seq (a page's `next_before`)"))
    })?;
    Ok(Json(
        s.console
            .dead_letters_before(p.string("destination").as_deref(), before, limit)
            .await?,
    ))
}

async fn dead_letter(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
) -> ApiResult<ops::DeadDoc> {
    Params::parse(q, &[])?;
    Ok(Json(s.console.dead_letter(message_id(path)?).await?))
}

async fn redrive(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
) -> ApiResult<ops::RedriveDoc> {
    let p = Params::parse(q, &["force"])?;
    let force = p.flag("force")?;
    Ok(Json(s.console.redrive(message_id(path)?, force).await?))
}

/// `POST /dead/redrive`: `{"destination": …, "force": …}`, both optional (an empty body
/// re-drives every dead letter that is not moot).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RedriveAllBody {
    #[serde(default)]
    destination: Option<String>,
    #[serde(default)]
    force: bool,
}

async fn redrive_all(
    State(s): State<AppState>,
    RawQuery(q): RawQuery,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<ops::RedriveAllDoc> {
    Params::parse(q, &[])?;
    let b: RedriveAllBody = body(bytes, Some(RedriveAllBody::default))?;
    Ok(Json(
        s.console
            .redrive_all(b.destination.as_deref(), b.force)
            .await?,
    ))
}

async fn purge(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
) -> ApiResult<ops::PurgeDoc> {
    Params::parse(q, &[])?;
    Ok(Json(s.console.purge(message_id(path)?).await?))
}

/// `POST /dead/purge`: `{"older_than": "7d"}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    older_than: String,
}

async fn purge_older(
    State(s): State<AppState>,
    RawQuery(q): RawQuery,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<ops::PurgeDoc> {
    Params::parse(q, &[])?;
    let b: PurgeBody = body(bytes, None)?;
    let older_than = crate::time::parse_duration(&b.older_than)
        .map_err(|e| ApiError::invalid(format!("`older_than`: {e}")))?;
    Ok(Json(s.console.purge_older(older_than).await?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::rfc3339;

    #[test]
    fn times() {
        assert_eq!(parse_time("1732281777111"), Ok(1_732_281_777_111));
        assert_eq!(
            parse_time("2024-11-22T13:22:57.111Z"),
            Ok(1_732_281_777_111)
        );
        assert_eq!(parse_time("2024-11-22T13:22:57Z"), Ok(1_732_281_777_000));
        assert_eq!(
            parse_time("2024-11-22T14:22:57.1+01:00"),
            Ok(1_732_281_777_100)
        );
        assert_eq!(
            parse_time("2024-11-22T13:22:57.111999Z"),
            Ok(1_732_281_777_111)
        );
        assert_eq!(parse_time("2000-02-29T00:00:00.000Z"), Ok(951_782_400_000));
        for ms in [0, 951_782_400_000, 1_732_281_777_111, 4_102_444_800_123] {
            assert_eq!(parse_time(&rfc3339(ms)), Ok(ms));
        }
        for bad in [
            "",
            "yesterday",
            "2024-11-22",
            "2024-11-22T13:22:57",
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-11-22T13:22:57.Z",
            "2024-11-22T13:22:57+1:00",
            "2024-11-22T13:22:57+-1:00",
            "2024-11-22T13:22:57+24:00",
            "+2024-11-22T13:22:57Z",
            "-5",
            "99999999999999999999",
        ] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_and_values() {
        assert_eq!(parse_limit("1"), Ok(1));
        assert_eq!(parse_limit("1000"), Ok(1000));
        for bad in ["0", "1001", "x", "-1", ""] {
            assert!(parse_limit(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_bool("true"), Ok(true));
        assert_eq!(parse_bool("0"), Ok(false));
        assert!(parse_bool("yes").is_err());
    }

    #[test]
    fn params() {
        let p = Params::parse(Some("name=a+b%2Fc&state=&limit=5".into()), SAGA_PARAMS).unwrap();
        assert_eq!(p.string("name").as_deref(), Some("a b/c"));
        assert_eq!(p.string("state"), None, "an empty value is absent");
        assert!(Params::parse(Some("bogus=1".into()), SAGA_PARAMS).is_err());
        assert!(Params::parse(Some("name=a&name=b".into()), SAGA_PARAMS).is_err());
        assert!(Params::parse(Some("name=%zz".into()), SAGA_PARAMS).is_err());
        assert!(Params::parse(Some("name=%e9".into()), SAGA_PARAMS).is_err());
        assert!(Params::parse(None, &[]).is_ok());
        assert!(Params::parse(Some("x".into()), &[]).is_err());
    }
}
