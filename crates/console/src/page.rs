//! The web page: server-rendered HTML over the console's calls (no second
//! implementation of anything: every read and every action is a [`Console`] call).
//!
//! | route | what |
//! |---|---|
//! | `GET /` | overview: sagas by state, outbox and relay lag, dead letters, the remote destinations with the broker's figures (given a broker), stalled and stuck sagas; re-fetched every 2 s |
//! | `GET /fragments/overview` | the overview's live part alone (what the page's script re-fetches) |
//! | `GET /sagas` | the list, with the API's filters (`state`, `name`, `key`, `waiting`, `stalled`, `cursor`, `limit`) |
//! | `GET /sagas/{id}` | one saga: its timeline, ledger, data, key, Jaeger link, the actions its state allows, whether it is paused (by whom, why) with pause / resume, its rewinds (to which step, by whom, why; under way or done) with "Rewind to" for a running saga |
//! | `POST /sagas/{id}/abort\|retry\|skip` | [`Console::act`], then back to the saga's page (303) |
//! | `POST /sagas/{id}/pause\|resume` | [`Console::pause`] (by `console`, with the form's `reason`) / [`Console::resume`], then back (303) |
//! | `POST /sagas/{id}/rewind` | [`Console::rewind`] (by `console`, to the form's `to`, with its `reason`), then back (303) |
//! | `GET /dead` | dead letters with their reason, whether re-driving them is moot, redrive / purge |
//! | `POST /dead/{id}/redrive\|purge` | [`Console::redrive`] (never forced: a moot one is purged by its own button) / [`Console::purge`], then back (303) |
//! | `GET /schedules` | the schedules: saga, cron and time zone, paused or active, next due (and how far off), last fired (and the saga it started), fired / skipped, last error; pause / resume |
//! | `POST /schedules/{name}/pause\|resume` | [`Console::pause_schedule`] / [`Console::resume_schedule`], then back (303) |
//! | `GET /assets/console.css\|console.js\|icon.svg` | the one stylesheet, the one script (`confirm()` before each action, the overview's refresh), the icon |
//!
//! Every value from the database is escaped. The pages carry a Content-Security-Policy
//! that allows only this origin's stylesheet and script (`/assets/`), and refuse to be
//! framed. The actions are HTML forms (each asks `confirm()` first, from the script);
//! a POST that a browser marks as coming from another site (`Sec-Fetch-Site`, `Origin`)
//! is refused with 403 and nothing done, as is any request to a `Host` the console
//! does not answer to (421), by the router's guard (`http/guard.rs`) before any of
//! these routes.

mod assets;
mod html;
mod params;
mod remote;
mod rewind;
mod saga;
mod schedules;
mod timeline;
mod views;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use crate::http::state::AppState;
use crate::{Action, Console, Error};
use html::error_page;
use params::{DeadParams, Done, ListParams, fail, form_field};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(overview))
        .route("/fragments/overview", get(overview_fragment))
        .route("/sagas", get(sagas))
        .route("/sagas/{id}", get(saga))
        .route("/sagas/{id}/{action}", post(saga_action))
        .route("/dead", get(dead))
        .route("/dead/{id}/{action}", post(dead_action))
        .route("/schedules", get(schedule_list))
        .route("/schedules/{name}/{action}", post(schedule_action))
        .route("/assets/console.css", get(assets::css))
        .route("/assets/console.js", get(assets::js))
        .route("/assets/icon.svg", get(assets::icon))
}

async fn overview(State(s): State<AppState>) -> Response {
    views::overview(&s.console).await
}

async fn overview_fragment(State(s): State<AppState>) -> Response {
    views::overview_fragment(&s.console).await
}

async fn sagas(State(s): State<AppState>, Query(p): Query<ListParams>) -> Response {
    views::sagas(&s.console, p).await
}

async fn saga(
    State(s): State<AppState>,
    Path(id): Path<String>,
    Query(done): Query<Done>,
) -> Response {
    let notice = done.done.as_deref().and_then(|d| match d {
        "pause" => Some(saga::Notice::Paused),
        "resume" => Some(saga::Notice::Resumed),
        "rewind" => Some(saga::Notice::Rewound),
        other => parse_action(other).map(saga::Notice::Done),
    });
    saga::page(&s.console, s.config.jaeger_url.as_deref(), &id, notice).await
}

fn parse_action(s: &str) -> Option<Action> {
    [Action::Abort, Action::Retry, Action::Skip]
        .into_iter()
        .find(|a| a.as_str() == s)
}

/// `POST /sagas/{id}/{action}`: abort, retry, skip; pause (the form's `reason`, by
/// `console`) and resume; rewind (the form's `to` and `reason`, by `console`).
async fn saga_action(
    State(s): State<AppState>,
    Path((id, action)): Path<(String, String)>,
    form: Bytes,
) -> Response {
    if parse_action(&action).is_none() && !["pause", "resume", "rewind"].contains(&action.as_str())
    {
        return error_page(
            StatusCode::NOT_FOUND,
            &format!("no action `{action}` (abort, retry, skip, pause, resume, rewind)"),
        );
    }
    let saga_id = match saga::parse_id(&id) {
        Ok(saga_id) => saga_id,
        Err(why) => return error_page(StatusCode::BAD_REQUEST, &why),
    };
    let done = match (action.as_str(), parse_action(&action)) {
        (_, Some(a)) => s.console.act(saga_id, a).await,
        ("pause", _) => {
            let reason = form_field(&form, "reason").unwrap_or_default();
            s.console.pause(saga_id, "console", &reason).await
        }
        ("rewind", _) => {
            let to = form_field(&form, "to").unwrap_or_default();
            let reason = form_field(&form, "reason").unwrap_or_default();
            s.console.rewind(saga_id, &to, "console", &reason).await
        }
        _ => s.console.resume(saga_id).await,
    };
    match done {
        Ok(doc) => Redirect::to(&format!(
            "/sagas/{}?done={}",
            html::pct(&doc.saga.id),
            html::pct(&action)
        ))
        .into_response(),
        // Refused (the state does not allow it): the saga's page, saying why.
        Err(e @ Error::Refused(_)) => {
            let jaeger = s.config.jaeger_url.as_deref();
            let mut r = saga::page(&s.console, jaeger, &id, Some(saga::Notice::Refused(e))).await;
            if r.status().is_success() {
                *r.status_mut() = StatusCode::CONFLICT;
            }
            r
        }
        Err(e) => fail(&e),
    }
}

async fn dead(
    State(s): State<AppState>,
    Query(p): Query<DeadParams>,
    Query(done): Query<Done>,
) -> Response {
    views::dead(&s.console, p, done).await
}

async fn dead_action(
    State(s): State<AppState>,
    Path((id, action)): Path<(String, String)>,
) -> Response {
    let Ok(msg) = id.parse::<agentsaga_core::MessageId>() else {
        return error_page(
            StatusCode::BAD_REQUEST,
            &format!("`{id}` is not a message id"),
        );
    };
    let c: &Console = &s.console;
    let done = match action.as_str() {
        "redrive" => c.redrive(msg, false).await.map(|d| d.outcome),
        "purge" => c.purge(msg).await.map(|_| "purged"),
        other => {
            return error_page(
                StatusCode::NOT_FOUND,
                &format!("no action `{other}` (redrive, purge)"),
            );
        }
    };
    match done {
        Ok(outcome) => Redirect::to(&format!("/dead?done={outcome}&id={msg}")).into_response(),
        Err(e) => fail(&e),
    }
}

async fn schedule_list(State(s): State<AppState>, Query(done): Query<Done>) -> Response {
    schedules::page(&s.console, done).await
}

async fn schedule_action(
    State(s): State<AppState>,
    Path((name, action)): Path<(String, String)>,
) -> Response {
    schedules::act(&s.console, &name, &action).await
}

#[cfg(test)]
mod tests;
