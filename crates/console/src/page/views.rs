//! The overview, the saga list and the dead letters.

use std::fmt::Write as _;

use agentsaga_core::header;
use agentsaga_saga::SagaState;
use axum::http::StatusCode;
use axum::response::Response;

use super::html::{Nav, badge, dur, error_page, esc, html_response, page, pct, query, when};
use super::params::{DeadParams, Done, ListParams, fail};
use crate::ops::{DeadDoc, SAGA_STATES, SagaDoc};
use crate::{Console, Result, SagaQuery};

/// `GET /`.
pub(crate) async fn overview(c: &Console) -> Response {
    match overview_html(c).await {
        Ok(live) => page(
            StatusCode::OK,
            "Overview",
            Nav::Overview,
            &format!(
                "<h1>Overview <span id=\"live\" class=\"live\"></span></h1>\n\
                 <div id=\"overview\" data-live=\"/fragments/overview\">\n{live}</div>"
            ),
        ),
        Err(e) => fail(&e),
    }
}

/// `GET /fragments/overview`: the part of `/` that the script re-fetches.
pub(crate) async fn overview_fragment(c: &Console) -> Response {
    match overview_html(c).await {
        Ok(live) => html_response(StatusCode::OK, live),
        Err(e) => html_response(
            crate::http::error::status_of(&e),
            format!(
                "<p class=\"notice bad\" role=\"alert\">{}</p>",
                esc(&e.to_string())
            ),
        ),
    }
}

fn card(class: &str, href: Option<&str>, key: &str, value: &str, label: &str) -> String {
    let inner = format!(
        "<span class=\"num\" data-count=\"{key}\">{value}</span><span class=\"label\">{label}</span>"
    );
    match href {
        Some(h) => format!("<div class=\"card {class}\"><a href=\"{h}\">{inner}</a></div>"),
        None => format!("<div class=\"card {class}\">{inner}</div>"),
    }
}

async fn overview_html(c: &Console) -> Result<String> {
    let st = c.status().await?;
    let mut out = String::from("<h2>Sagas</h2>\n<section class=\"cards\">\n");
    for state in SAGA_STATES {
        let n = st.sagas.get(state.as_str()).copied().unwrap_or(0);
        let class = match state {
            SagaState::Stuck if n > 0 => "bad",
            _ => "",
        };
        let href = format!("/sagas?state={}", state.as_str());
        out += &card(
            class,
            Some(&href),
            state.as_str(),
            &n.to_string(),
            state.as_str(),
        );
        out.push('\n');
    }
    out += &card(
        "",
        Some("/sagas"),
        "total",
        &st.sagas_total.to_string(),
        "all sagas",
    );
    out += "\n</section>\n<h2>Outbox and operators</h2>\n<section class=\"cards\">\n";
    let lag = st
        .outbox
        .oldest_pending_age_ms
        .map_or_else(|| "none".to_owned(), |ms| dur(ms as i64));
    let waiting: u64 = st.starts_waiting.values().sum();
    let stalled_label = format!(
        "stalled (no progress for {})",
        dur(st.stalled_after_ms as i64)
    );
    for (class, href, key, value, label) in [
        (
            "",
            None,
            "pending",
            st.outbox.pending.to_string(),
            "outbox pending",
        ),
        (
            "",
            None,
            "in_flight",
            st.outbox.in_flight.to_string(),
            "in flight",
        ),
        (
            "",
            None,
            "delivered",
            st.outbox.delivered.to_string(),
            "delivered, not pruned",
        ),
        ("", None, "lag", lag, "relay lag (oldest ready row)"),
        (
            if st.dead_letters > 0 { "bad" } else { "" },
            Some("/dead"),
            "dead",
            st.dead_letters.to_string(),
            "dead letters",
        ),
        (
            if st.stalled > 0 { "warn" } else { "" },
            Some("/sagas?stalled=1"),
            "stalled",
            st.stalled.to_string(),
            stalled_label.as_str(),
        ),
        (
            "",
            None,
            "starts_waiting",
            waiting.to_string(),
            "starts waiting for room",
        ),
    ] {
        out += &card(class, href, key, &value, label);
        out.push('\n');
    }
    out += "</section>\n";
    if let Some(r) = &st.remote {
        out += &super::remote::section(r);
    }

    let stuck = c
        .sagas(&SagaQuery {
            state: Some(SagaState::Stuck),
            limit: 10,
            ..SagaQuery::default()
        })
        .await?;
    let stalled = c
        .sagas(&SagaQuery {
            stalled: true,
            limit: 10,
            ..SagaQuery::default()
        })
        .await?;
    out += "<h2>Needs an operator</h2>\n";
    if stuck.sagas.is_empty() && stalled.sagas.is_empty() {
        out += "<p class=\"muted\">Nothing is stuck or stalled.</p>\n";
    }
    if !stuck.sagas.is_empty() {
        let _ = writeln!(
            out,
            "<p>Stuck (newest {}; <a href=\"/sagas?state=stuck\">all</a>): retry, skip or abort them from their page.</p>",
            stuck.sagas.len()
        );
        out += &saga_table(&stuck.sagas, "stuck");
    }
    if !stalled.sagas.is_empty() {
        let _ = writeln!(
            out,
            "<p>Stalled (newest {}; <a href=\"/sagas?stalled=1\">all</a>): running or compensating with nothing pending for them, or no progress for {}.</p>",
            stalled.sagas.len(),
            dur(st.stalled_after_ms as i64)
        );
        out += &saga_table(&stalled.sagas, "stalled");
    }
    let _ = writeln!(
        out,
        "<p class=\"muted\">Backend: {} · as of {}</p>",
        esc(st.backend),
        crate::time::rfc3339(c.store().clock().now_ms())
    );
    Ok(out)
}

/// A table of sagas, each linking to its page.
pub(crate) fn saga_table(sagas: &[SagaDoc], id: &str) -> String {
    let mut out = format!(
        "<table id=\"{}\">\n<thead><tr><th>Saga</th><th>Name</th><th>State</th><th>Key</th>\
         <th>Waiting for</th><th>Created</th><th>Updated</th><th>Error</th></tr></thead>\n<tbody>\n",
        esc(id)
    );
    for s in sagas {
        let _ = writeln!(
            out,
            "<tr data-saga=\"{id}\"><td class=\"mono\"><a href=\"/sagas/{href}\">{id}</a></td>\
             <td>{name} <span class=\"muted\">v{version}</span></td><td>{state}</td>\
             <td class=\"mono\">{key}</td><td>{waiting}</td><td>{created}</td><td>{updated}</td>\
             <td class=\"err\" title=\"{error}\">{error_short}</td></tr>",
            id = esc(&s.id),
            href = pct(&s.id),
            name = esc(&s.name),
            version = s.version,
            state = badge(s.state),
            key = esc(s.key.as_deref().unwrap_or("")),
            waiting = match (&s.waiting_for, &s.sleeping_until) {
                (Some(w), _) => esc(w),
                (None, Some(until)) => format!("sleeps until {}", when(Some(until))),
                (None, None) => String::new(),
            },
            created = when(Some(&s.created_at)),
            updated = when(Some(&s.updated_at)),
            error = esc(s.error.as_deref().unwrap_or("")),
            error_short = esc(&short(s.error.as_deref().unwrap_or(""), 80)),
        );
    }
    out += "</tbody>\n</table>\n";
    out
}

/// At most `n` characters of `s`, with an ellipsis if cut.
pub(crate) fn short(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(n).collect();
        t.push('…');
        t
    }
}

/// A form field's text: empty means not given.
fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// A checkbox or flag: `1`, `true`, `on`, `yes` (or `0`, `false`, `off`, `no`, empty).
fn flag(name: &str, v: &Option<String>) -> std::result::Result<bool, String> {
    match given(v) {
        None => Ok(false),
        Some("1" | "true" | "on" | "yes") => Ok(true),
        Some("0" | "false" | "off" | "no") => Ok(false),
        Some(other) => Err(format!("`{name}={other}`: expected true or false")),
    }
}

fn limit(v: &Option<String>) -> std::result::Result<u32, String> {
    match given(v) {
        None => Ok(0),
        Some(n) => n
            .parse()
            .map_err(|_| format!("`limit={n}`: expected a whole number")),
    }
}

/// `GET /sagas`.
pub(crate) async fn sagas(c: &Console, p: ListParams) -> Response {
    let parsed = (|| -> std::result::Result<SagaQuery, String> {
        Ok(SagaQuery {
            state: given(&p.state)
                .map(|s| s.parse::<SagaState>())
                .transpose()?,
            name: given(&p.name).map(str::to_owned),
            key: given(&p.key).map(str::to_owned),
            waiting: flag("waiting", &p.waiting)?,
            stalled: flag("stalled", &p.stalled)?,
            cursor: given(&p.cursor).map(str::to_owned),
            limit: limit(&p.limit)?,
            ..SagaQuery::default()
        })
    })();
    let q = match parsed {
        Ok(q) => q,
        Err(why) => return error_page(StatusCode::BAD_REQUEST, &why),
    };
    let list = match c.sagas(&q).await {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    let mut body = String::from("<h1>Sagas</h1>\n");
    // The filters: a GET form, so a filtered list is a link.
    body += "<form class=\"filters\" method=\"get\" action=\"/sagas\">\n<label>State<select name=\"state\">\
             <option value=\"\">any</option>";
    for s in SAGA_STATES {
        let selected = if q.state == Some(s) { " selected" } else { "" };
        let _ = write!(body, "<option{selected}>{}</option>", s.as_str());
    }
    let checked = |b: bool| if b { " checked" } else { "" };
    let _ = write!(
        body,
        "</select></label>\n<label>Name<input type=\"text\" name=\"name\" value=\"{}\"></label>\n\
         <label>Key<input type=\"text\" name=\"key\" value=\"{}\"></label>\n\
         <label class=\"check\"><input type=\"checkbox\" name=\"waiting\" value=\"1\"{}> waiting for a signal</label>\n\
         <label class=\"check\"><input type=\"checkbox\" name=\"stalled\" value=\"1\"{}> stalled</label>\n\
         <button type=\"submit\">Filter</button> <a href=\"/sagas\">clear</a>\n</form>\n",
        esc(q.name.as_deref().unwrap_or("")),
        esc(q.key.as_deref().unwrap_or("")),
        checked(q.waiting),
        checked(q.stalled),
    );
    if list.sagas.is_empty() {
        body += "<p class=\"muted\" id=\"none\">No saga matches.</p>\n";
    } else {
        body += &saga_table(&list.sagas, "sagas");
    }
    if let Some(cursor) = &list.next_cursor {
        let limit = (q.limit > 0).then(|| q.limit.to_string());
        let next = query(&[
            ("state", q.state.map(SagaState::as_str)),
            ("name", q.name.as_deref()),
            ("key", q.key.as_deref()),
            ("waiting", q.waiting.then_some("1")),
            ("stalled", q.stalled.then_some("1")),
            ("limit", limit.as_deref()),
            ("cursor", Some(cursor)),
        ]);
        let _ = writeln!(
            body,
            "<p class=\"pager\"><a id=\"next\" href=\"/sagas{next}\">Next page →</a></p>"
        );
    }
    page(StatusCode::OK, "Sagas", Nav::Sagas, &body)
}

/// `GET /dead`.
pub(crate) async fn dead(c: &Console, p: DeadParams, done: Done) -> Response {
    let n = match limit(&p.limit) {
        Ok(n) => n,
        Err(why) => return error_page(StatusCode::BAD_REQUEST, &why),
    };
    let destination = given(&p.destination);
    let list = match c.dead_letters(destination, n).await {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    let mut body = String::from("<h1>Dead letters</h1>\n");
    // What was just done: only known outcomes and a well-formed id are echoed.
    let id = given(&done.id).and_then(|i| i.parse::<agentsaga_core::MessageId>().ok());
    match (done.done.as_deref(), id) {
        (Some("redriven"), Some(id)) => {
            let _ = writeln!(
                body,
                "<p class=\"notice ok\" role=\"status\">Dead letter <code>{id}</code> re-driven: pending again, its attempts reset.</p>"
            );
        }
        (Some("purged"), Some(id)) => {
            let _ = writeln!(
                body,
                "<p class=\"notice ok\" role=\"status\">Dead letter <code>{id}</code> purged.</p>"
            );
        }
        _ => {}
    }
    if let Some(d) = destination {
        let _ = writeln!(
            body,
            "<p>To <code>{}</code> only · <a href=\"/dead\">all</a></p>",
            esc(d)
        );
    }
    if list.dead_letters.is_empty() {
        body += "<p class=\"muted\" id=\"none\">No dead letters.</p>\n";
    } else {
        let shown = list.dead_letters.len();
        let _ = writeln!(
            body,
            "<p class=\"muted\">{shown} shown, oldest first. Re-driving one makes it pending again with its attempts reset; \
             one whose saga has moved past it is moot: re-driving it is refused, purge it instead.</p>"
        );
        body += "<table id=\"dead\">\n<thead><tr><th>Message</th><th>To</th><th>Saga</th>\
                 <th>Attempts</th><th>Created</th><th>Why it died</th><th>Moot</th><th></th></tr></thead>\n<tbody>\n";
        for d in &list.dead_letters {
            body += &dead_row(d);
        }
        body += "</tbody>\n</table>\n";
    }
    page(StatusCode::OK, "Dead letters", Nav::Dead, &body)
}

fn dead_row(d: &DeadDoc) -> String {
    let saga = d
        .headers
        .get(header::SAGA_ID)
        .map_or_else(String::new, |s| {
            format!(
                "<a class=\"mono\" href=\"/sagas/{}\">{}</a>",
                pct(s),
                esc(&short(s, 13))
            )
        });
    let payload = serde_json::to_string_pretty(&d.payload).unwrap_or_default();
    let moot = match &d.moot {
        Some(why) => format!("<span class=\"err\">{}</span>", esc(why)),
        None => "<span class=\"muted\">no</span>".to_owned(),
    };
    let id = esc(&d.id);
    let href = pct(&d.id);
    let redrive = if d.moot.is_none() {
        format!(
            "<form method=\"post\" action=\"/dead/{href}/redrive\" data-confirm=\"Re-drive dead letter {id} to {dest}? It becomes pending again, with its attempts reset.\">\
             <button type=\"submit\" name=\"redrive\">Redrive</button></form>",
            dest = esc(&d.destination)
        )
    } else {
        String::new()
    };
    format!(
        "<tr data-dead=\"{id}\"><td class=\"mono\">{id}<details><summary>payload</summary><pre class=\"json\">{payload}</pre></details></td>\
         <td><code>{dest}</code>{key}</td><td>{saga}</td><td>{attempts}</td><td>{created}</td>\
         <td class=\"err\">{error}</td><td>{moot}</td>\
         <td><div class=\"actions\">{redrive}<form method=\"post\" action=\"/dead/{href}/purge\" \
         data-confirm=\"Purge dead letter {id}? It is deleted for good.\"><button class=\"danger\" type=\"submit\" name=\"purge\">Purge</button></form></div></td></tr>\n",
        payload = esc(&payload),
        dest = esc(&d.destination),
        key = d.key.as_deref().map_or_else(String::new, |k| format!(
            "<div class=\"muted\">key <code>{}</code></div>",
            esc(k)
        )),
        attempts = d.attempts,
        created = when(Some(&d.created_at)),
        error = esc(d.last_error.as_deref().unwrap_or("")),
    )
}
