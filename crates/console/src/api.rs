//! The admin HTTP API, `/api/v1`: the console's documents as JSON.
//!
//! Every handler checks its query parameters, path and body first (an unknown
//! parameter, a bad value, a malformed id or body is a 400, a body over [`MAX_BODY`] a
//! 413, before anything is read or written), then makes exactly one [`Console`] call
//! and answers with its document, the one `agentsaga … --json` prints. Errors are
//! `{"error": {"kind": …, "message": …}}` ([`ApiError`]).
//!
//! [`Console`]: crate::Console

mod request;
mod schedules;

use agentsaga_saga::{Budget, Signal};
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::ops::{self, Action, SagaQuery};
use request::{
    MAX_BODY, Params, SAGA_PARAMS, body, message_id, parse_limit, parse_parent, parse_state,
    parse_time, saga_id,
};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/status", get(status))
        .route("/remote", get(remote))
        .route("/sagas", get(sagas).post(start))
        .route("/sagas/{id}", get(saga))
        .route("/sagas/{id}/abort", post(abort))
        .route("/sagas/{id}/retry", post(retry))
        .route("/sagas/{id}/skip", post(skip))
        .route("/sagas/{id}/signal", post(signal))
        .route("/sagas/{id}/budget", post(raise_budget))
        .route("/sagas/{id}/pause", post(pause))
        .route("/sagas/{id}/resume", post(resume))
        .route("/sagas/{id}/rewind", post(rewind))
        .route("/schedules", get(schedules::list).post(schedules::create))
        .route(
            "/schedules/{name}",
            get(schedules::get)
                .put(schedules::put)
                .delete(schedules::delete),
        )
        .route("/schedules/{name}/pause", post(schedules::pause))
        .route("/schedules/{name}/resume", post(schedules::resume))
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

type ApiResult<T> = Result<Json<T>, ApiError>;

async fn status(State(s): State<AppState>, RawQuery(q): RawQuery) -> ApiResult<ops::StatusDoc> {
    Params::parse(q, &[])?;
    Ok(Json(s.console.status().await?))
}

async fn remote(State(s): State<AppState>, RawQuery(q): RawQuery) -> ApiResult<ops::RemoteList> {
    Params::parse(q, &[])?;
    Ok(Json(s.console.remote().await?))
}

async fn sagas(State(s): State<AppState>, RawQuery(q): RawQuery) -> ApiResult<ops::SagaPage> {
    let p = Params::parse(q, SAGA_PARAMS)?;
    let query = SagaQuery {
        state: p.value("state", parse_state)?,
        name: p.string("name"),
        key: p.string("key"),
        waiting: p.flag("waiting")?,
        sleeping: p.flag("sleeping")?,
        parent: p.value("parent", parse_parent)?,
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

/// `POST /sagas/{id}/budget`: `{"tokens_in": …, "tokens_out": …, "cost_micros": …,
/// "calls": …}`, each optional but at least one (the limits to set; the others are
/// kept). An empty body, `{}`, or any other field is a 400.
async fn raise_budget(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<ops::ShowDoc> {
    Params::parse(q, &[])?;
    let id = saga_id(path)?;
    let raise: Budget = body(bytes, None)?;
    Ok(Json(s.console.raise_budget(id, raise).await?))
}

/// `POST /sagas/{id}/pause`: `{"reason": …, "by": …}`; `reason` is needed (missing or
/// empty: a 400 saying so), `by` is optional (`console`).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    by: Option<String>,
}

async fn pause(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<ops::ShowDoc> {
    Params::parse(q, &[])?;
    let id = saga_id(path)?;
    let b: PauseBody = body(bytes, Some(PauseBody::default))?;
    let by = b.by.as_deref().unwrap_or("console");
    Ok(Json(s.console.pause(id, by, &b.reason).await?))
}

/// `POST /sagas/{id}/resume`: no body.
async fn resume(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
) -> ApiResult<ops::ShowDoc> {
    Params::parse(q, &[])?;
    Ok(Json(s.console.resume(saga_id(path)?).await?))
}

/// `POST /sagas/{id}/rewind`: `{"to": …, "reason": …, "by": …}`; `to` and `reason`
/// are needed (missing or empty: a 400 saying so), `by` is optional (`console`).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RewindBody {
    #[serde(default)]
    to: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    by: Option<String>,
}

async fn rewind(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<ops::ShowDoc> {
    Params::parse(q, &[])?;
    let id = saga_id(path)?;
    let b: RewindBody = body(bytes, Some(RewindBody::default))?;
    let by = b.by.as_deref().unwrap_or("console");
    Ok(Json(s.console.rewind(id, &b.to, by, &b.reason).await?))
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
