//! The schedules: each one's saga, calendar, next and last firing, counts and last
//! error, with pause / resume buttons.

use std::fmt::Write as _;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};

use super::html::{Nav, badge, dur, error_page, esc, page as frame, pct, when};
use super::params::{Done, fail};
use super::views::short;
use crate::Console;
use crate::ops::ScheduleDoc;
use crate::time::from_now;

/// `GET /schedules`.
pub(crate) async fn page(c: &Console, done: Done) -> Response {
    let list = match c.schedules().await {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    let now = c.store().clock().now_ms();
    let mut body = String::from("<h1>Schedules</h1>\n");
    // What was just done: only a known outcome and a schedule that exists are echoed.
    let named = done
        .id
        .as_deref()
        .filter(|n| list.schedules.iter().any(|s| s.view.schedule.name == *n));
    let what = match done.done.as_deref() {
        Some("paused") => Some("paused: it fires nothing until resumed"),
        Some("resumed") => Some("resumed: it fires from its next slot on"),
        _ => None,
    };
    if let (Some(what), Some(name)) = (what, named) {
        let _ = writeln!(
            body,
            "<p class=\"notice ok\" id=\"notice\" role=\"status\">Schedule <code>{}</code> {what}.</p>",
            esc(name)
        );
    }
    if list.schedules.is_empty() {
        body += "<p class=\"muted\" id=\"none\">No schedules. A runtime creates them \
                 (<code>runtime.schedules().create(…)</code>), as does \
                 <code>POST /api/v1/schedules</code>.</p>\n";
        return frame(StatusCode::OK, "Schedules", Nav::Schedules, &body);
    }
    let _ = writeln!(
        body,
        "<p class=\"muted\">{n} schedule{s}, by name. Each starts its saga at the times its \
         cron expression names in its time zone (times below are UTC). A paused one fires \
         nothing; resumed, it goes on from its next slot (the slots it slept through are not \
         caught up).</p>",
        n = list.schedules.len(),
        s = if list.schedules.len() == 1 { "" } else { "s" },
    );
    body += "<table id=\"schedules\">\n<thead><tr><th>Schedule</th><th>Saga</th><th>Calendar</th>\
             <th>State</th><th>Next due</th><th>Last fired</th><th>Fired / skipped</th>\
             <th>Last error</th><th></th></tr></thead>\n<tbody>\n";
    for s in &list.schedules {
        body += &row(s, now);
    }
    body += "</tbody>\n</table>\n";
    frame(StatusCode::OK, "Schedules", Nav::Schedules, &body)
}

/// How long past its due time a schedule is shown as late (a runtime looks at least
/// every second).
const LATE_MS: i64 = 5_000;

fn row(d: &ScheduleDoc, now: i64) -> String {
    let (v, s) = (&d.view, &d.view.schedule);
    let name = esc(&s.name);
    let input = serde_json::to_string_pretty(&s.input).unwrap_or_default();
    let next = match (s.paused, &d.next_due, v.next_due_ms) {
        (true, _, _) => "<span class=\"muted\">paused</span>".to_owned(),
        // Well past its time: no process that registers its saga is firing it.
        (false, Some(at), Some(ms)) if now - ms > LATE_MS => format!(
            "{}<div class=\"late\" data-late>late by {}: no process with saga <code>{}</code> \
             has fired it</div>",
            when(Some(at)),
            dur(now - ms),
            esc(&s.saga)
        ),
        (false, Some(at), Some(ms)) => format!(
            "{}<div class=\"muted\" data-in>{}</div>",
            when(Some(at)),
            esc(&from_now(ms, now))
        ),
        _ => "<span class=\"muted\">never: no time to come</span>".to_owned(),
    };
    let last = match (&d.last_fired, v.last_saga_id) {
        (Some(at), Some(id)) => format!(
            "{}<div><a class=\"mono\" href=\"/sagas/{}\" title=\"the saga it started\">{}</a></div>",
            when(Some(at)),
            pct(&id.to_string()),
            esc(&short(&id.to_string(), 13))
        ),
        (Some(at), None) => when(Some(at)),
        (None, _) => "<span class=\"muted\">never</span>".to_owned(),
    };
    let queued = v.queued_slot_ms.map_or_else(String::new, |_| {
        "<div class=\"muted\">a slot waits for the running saga</div>".to_owned()
    });
    let (act, label, class, question) = if s.paused {
        (
            "resume",
            "Resume",
            "",
            "Resume schedule {name}? It fires from its next slot on; the slots it slept through are not caught up.",
        )
    } else {
        (
            "pause",
            "Pause",
            "quiet",
            "Pause schedule {name}? It fires nothing until resumed.",
        )
    };
    format!(
        "<tr data-schedule=\"{name}\"><td class=\"mono nowrap\">{name}</td>\
         <td><span class=\"nowrap\">{saga}</span><details><summary>input</summary><pre class=\"json\">{input}</pre></details></td>\
         <td><code>{cron}</code><div class=\"muted\">{tz}</div>\
         <div class=\"muted small\">overlap {overlap} · catch-up {catch_up}{jitter}</div></td>\
         <td>{state}</td><td>{next}{queued}</td><td>{last}</td>\
         <td class=\"nowrap\"><span data-count=\"fired\">{fired}</span> / \
         <span data-count=\"skipped\">{skipped}</span></td>\
         <td class=\"err last-error\" title=\"{error}\">{error_short}</td>\
         <td><form method=\"post\" action=\"/schedules/{href}/{act}\" data-confirm=\"{question}\">\
         <button type=\"submit\" class=\"{class}\" name=\"{act}\">{label}</button></form></td></tr>\n",
        saga = esc(&s.saga),
        input = esc(&input),
        cron = esc(&s.cron),
        tz = esc(&s.time_zone),
        overlap = s.overlap,
        catch_up = s.catch_up,
        jitter = if s.jitter.is_zero() {
            String::new()
        } else {
            format!(" · jitter {}", dur(agentsaga_core::clock::millis(s.jitter)))
        },
        state = badge(if s.paused { "paused" } else { "active" }),
        fired = v.fired,
        skipped = v.skipped,
        error = esc(v.last_error.as_deref().unwrap_or("")),
        error_short = esc(&short(v.last_error.as_deref().unwrap_or(""), 80)),
        href = pct(&s.name),
        question = esc(&question.replace("{name}", &s.name)),
    )
}

/// `POST /schedules/{name}/pause|resume`: done, then back to the list (303).
pub(crate) async fn act(c: &Console, name: &str, action: &str) -> Response {
    let done = match action {
        "pause" => c.pause_schedule(name).await.map(|_| "paused"),
        "resume" => c.resume_schedule(name).await.map(|_| "resumed"),
        other => {
            return error_page(
                StatusCode::NOT_FOUND,
                &format!("no action `{other}` (pause, resume)"),
            );
        }
    };
    match done {
        Ok(outcome) => {
            Redirect::to(&format!("/schedules?done={outcome}&id={}", pct(name))).into_response()
        }
        Err(e) => fail(&e),
    }
}
