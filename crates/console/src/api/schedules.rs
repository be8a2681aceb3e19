//! `/schedules`: sagas started on a cron calendar. Read with `GET`; created (`POST`),
//! replaced (`PUT`), paused, resumed (`POST …/pause`, `…/resume`) and deleted
//! (`DELETE`) with the action token, through the same guards as every action.

use std::time::Duration;

use agentsaga_saga::schedule::{CatchUp, Overlap, Schedule};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use serde::Deserialize;
use serde_json::Value;

use super::request::{Params, body};
use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::ops::{ScheduleDoc, ScheduleList};

type ApiResult<T> = Result<Json<T>, ApiError>;

/// `POST /schedules` and `PUT /schedules/{name}`: `{"name": …, "saga": …, "cron": …,
/// "time_zone": …, "input": …, "overlap": …, "catch_up": …, "late_after_ms": …,
/// "jitter_ms": …, "paused": …}`. `saga` and `cron` are needed, and `name` by `POST`
/// (a `PUT` takes it from its path; given in its body too, the two must be the same);
/// the others default as `Schedule::new` has them (UTC, input `null`, overlap `skip`,
/// catch-up `none`, late after 60 s, no jitter, not paused). `catch_up` is `"none"`,
/// `"latest"`, `"all:N"`, or the object a schedule's document shows
/// (`{"policy": "all", "max": N}`); `late_after_ms` and `jitter_ms` may also be named
/// as the document names them (`late_after`, `jitter`, in ms).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleBody {
    #[serde(default)]
    name: Option<String>,
    saga: String,
    cron: String,
    #[serde(default)]
    time_zone: Option<String>,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    overlap: Option<String>,
    #[serde(default)]
    catch_up: Option<Value>,
    #[serde(default, alias = "late_after")]
    late_after_ms: Option<u64>,
    #[serde(default, alias = "jitter")]
    jitter_ms: Option<u64>,
    #[serde(default)]
    paused: bool,
}

impl ScheduleBody {
    /// The schedule it describes, named `name`; a 400 for a policy it misnames.
    fn schedule(self, name: String) -> Result<Schedule, ApiError> {
        let mut s = Schedule::new(name, self.saga, self.cron)
            .input(self.input)
            .paused(self.paused);
        if let Some(tz) = self.time_zone {
            s = s.time_zone(tz);
        }
        if let Some(o) = self.overlap {
            let o: Overlap = o
                .parse()
                .map_err(|e| ApiError::invalid(format!("`overlap`: {e}")))?;
            s = s.overlap(o);
        }
        if let Some(c) = self.catch_up {
            s = s
                .catch_up(catch_up(&c).map_err(|e| ApiError::invalid(format!("`catch_up`: {e}")))?);
        }
        if let Some(ms) = self.late_after_ms {
            s = s.late_after(Duration::from_millis(ms));
        }
        if let Some(ms) = self.jitter_ms {
            s = s.jitter(Duration::from_millis(ms));
        }
        Ok(s)
    }
}

/// A catch-up policy as text (`all:5`) or as a document shows it (`{"policy": "all",
/// "max": 5}`).
fn catch_up(v: &Value) -> Result<CatchUp, String> {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Object(o) => {
            let policy = o
                .get("policy")
                .and_then(Value::as_str)
                .ok_or("an object names its `policy`")?;
            if o.keys().any(|k| k != "policy" && k != "max") {
                return Err("an object has `policy` and, for `all`, `max`; no other field".into());
            }
            match (policy, o.get("max")) {
                ("all", Some(max)) => format!("all:{max}"),
                (_, Some(_)) => return Err("only the policy `all` takes a `max`".into()),
                (p, None) => p.to_owned(),
            }
        }
        _ => return Err("`none`, `latest`, `all:N` or {\"policy\": …, \"max\": …}".into()),
    };
    text.parse()
}

/// The schedule's name from the path.
fn name_of(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(name) = path.map_err(|e| ApiError::invalid(e.body_text()))?;
    Ok(name)
}

/// `GET /schedules`.
pub(super) async fn list(
    State(s): State<AppState>,
    RawQuery(q): RawQuery,
) -> ApiResult<ScheduleList> {
    Params::parse(q, &[])?;
    Ok(Json(s.console.schedules().await?))
}

/// `GET /schedules/{name}`.
pub(super) async fn get(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
) -> ApiResult<ScheduleDoc> {
    Params::parse(q, &[])?;
    Ok(Json(s.console.schedule(&name_of(path)?).await?))
}

/// `POST /schedules`: a new schedule (409 `refused` if one has its name).
pub(super) async fn create(
    State(s): State<AppState>,
    RawQuery(q): RawQuery,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<ScheduleDoc> {
    Params::parse(q, &[])?;
    let mut b: ScheduleBody = body(bytes, None)?;
    let Some(name) = b.name.take() else {
        return Err(ApiError::invalid(
            "`name` is missing: a new schedule needs its name",
        ));
    };
    let schedule = b.schedule(name)?;
    Ok(Json(s.console.create_schedule(&schedule).await?))
}

/// `PUT /schedules/{name}`: the schedule of that name, created or replaced.
pub(super) async fn put(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<ScheduleDoc> {
    Params::parse(q, &[])?;
    let name = name_of(path)?;
    let mut b: ScheduleBody = body(bytes, None)?;
    if let Some(other) = b.name.take().filter(|n| *n != name) {
        return Err(ApiError::invalid(format!(
            "the body names `{other}` and the path `{name}`: a schedule is renamed by \
             deleting it and creating the new one"
        )));
    }
    let schedule = b.schedule(name)?;
    Ok(Json(s.console.put_schedule(&schedule).await?))
}

/// `POST /schedules/{name}/pause`.
pub(super) async fn pause(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
) -> ApiResult<ScheduleDoc> {
    Params::parse(q, &[])?;
    Ok(Json(s.console.pause_schedule(&name_of(path)?).await?))
}

/// `POST /schedules/{name}/resume`.
pub(super) async fn resume(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
) -> ApiResult<ScheduleDoc> {
    Params::parse(q, &[])?;
    Ok(Json(s.console.resume_schedule(&name_of(path)?).await?))
}

/// `DELETE /schedules/{name}`: the schedule as it was (404 if there was none).
pub(super) async fn delete(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(q): RawQuery,
) -> ApiResult<ScheduleDoc> {
    Params::parse(q, &[])?;
    Ok(Json(s.console.delete_schedule(&name_of(path)?).await?))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn catch_up_as_text_or_as_shown() {
        assert_eq!(catch_up(&json!("latest")), Ok(CatchUp::Latest));
        assert_eq!(catch_up(&json!("all:5")), Ok(CatchUp::All { max: 5 }));
        assert_eq!(catch_up(&json!({"policy": "none"})), Ok(CatchUp::None));
        assert_eq!(
            catch_up(&json!({"policy": "all", "max": 7})),
            Ok(CatchUp::All { max: 7 })
        );
        for bad in [
            json!("sometimes"),
            json!(3),
            json!({"policy": "latest", "max": 2}),
            json!({"policy": "all", "max": 2, "x": 1}),
            json!({"max": 2}),
            json!({"policy": "all", "max": "x"}),
        ] {
            assert!(catch_up(&bad).is_err(), "{bad}");
        }
    }
}
