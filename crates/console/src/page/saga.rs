//! One saga's page: what it is, whether an operator paused it (who, why), what it used
//! and its budget (and why a spent one holds it), its rewinds, the actions its state
//! allows, pause or resume, rewind, its steps as a timeline, its compensation ledger and
//! its data.

use std::fmt::Write as _;

use agentsaga_saga::{SagaId, SagaState};
use axum::http::StatusCode;
use axum::response::Response;

use super::html::{Nav, badge, clock, dur, error_page, esc, pct, when};
use super::params::fail;
use super::timeline::timeline;
use super::views::short;
use crate::ops::{ShowDoc, StepDoc, budget_text, usage_text, waiting_text};
use crate::{Action, Console, Error};

/// What the page says above the saga.
pub(crate) enum Notice {
    /// The action was done (the page shows the saga as it now stands).
    Done(Action),
    /// The saga was paused.
    Paused,
    /// The saga was resumed.
    Resumed,
    /// A rewind was asked (its undos under way, or done at once).
    Rewound,
    /// The action was refused: why (nothing was changed).
    Refused(Error),
}

/// A saga id from the path, or why it is not one.
pub(crate) fn parse_id(id: &str) -> Result<SagaId, String> {
    id.parse::<SagaId>()
        .map_err(|_| format!("`{id}` is not a saga id (a UUID)"))
}

/// `GET /sagas/{id}` (and the page an action's refusal is shown on).
pub(crate) async fn page(
    c: &Console,
    jaeger: Option<&str>,
    id: &str,
    notice: Option<Notice>,
) -> Response {
    let saga_id = match parse_id(id) {
        Ok(i) => i,
        Err(why) => return error_page(StatusCode::BAD_REQUEST, &why),
    };
    let doc = match c.saga(saga_id).await {
        Ok(d) => d,
        Err(e) => return fail(&e),
    };
    let now = c.store().clock().now_ms();
    let title = format!("{} {}", doc.saga.name, short(&doc.saga.id, 13));
    let body = render(&doc, jaeger, notice.as_ref(), now);
    super::html::page(StatusCode::OK, &title, Nav::Sagas, &body)
}

fn render(doc: &ShowDoc, jaeger: Option<&str>, notice: Option<&Notice>, now: i64) -> String {
    let s = &doc.saga;
    let state: Option<SagaState> = s.state.parse().ok();
    let paused = s.paused.as_ref().map_or_else(String::new, |p| {
        format!(
            " <span class=\"badge st-paused\" id=\"paused\" title=\"paused at {}\">Paused by {}: {}</span>",
            esc(&p.at),
            esc(&p.by),
            esc(&p.reason)
        )
    });
    let mut out = format!(
        "<h1><span>{}</span> <span class=\"muted\">v{}</span> <span id=\"state\">{}</span>{paused}</h1>\n",
        esc(&s.name),
        s.version,
        badge(s.state)
    );
    match notice {
        Some(Notice::Done(a)) => {
            let _ = writeln!(
                out,
                "<p class=\"notice ok\" id=\"notice\" role=\"status\">{} done: the saga is now <b>{}</b>.</p>",
                capitalised(a.as_str()),
                esc(s.state)
            );
        }
        Some(Notice::Paused) => {
            out += "<p class=\"notice ok\" id=\"notice\" role=\"status\">Paused: \
             the saga sends nothing new until it is resumed.</p>\n"
        }
        Some(Notice::Resumed) => {
            out += "<p class=\"notice ok\" id=\"notice\" role=\"status\">Resumed: \
             what its pause held back goes out.</p>\n"
        }
        Some(Notice::Rewound) => {
            out += "<p class=\"notice ok\" id=\"notice\" role=\"status\">Rewound: \
             the chosen step and those after it are undone, then the saga runs again from it.</p>\n"
        }
        Some(Notice::Refused(e)) => {
            let _ = writeln!(
                out,
                "<p class=\"notice bad\" id=\"notice\" role=\"alert\">Refused, nothing was changed: {}</p>",
                esc(&e.to_string())
            );
        }
        None => {}
    }

    // Facts.
    let ran = s.updated_at_ms - s.created_at_ms;
    let _ = write!(
        out,
        "<dl class=\"facts\">\n<dt>Id</dt><dd class=\"mono\" id=\"saga-id\">{id}</dd>\n\
         <dt>Key</dt><dd class=\"mono\" id=\"key\">{key}</dd>\n\
         <dt>Started</dt><dd>{created}</dd>\n\
         <dt>Last change</dt><dd>{updated} <span class=\"muted\">({ran} after the start)</span></dd>\n",
        id = esc(&s.id),
        key = s
            .key
            .as_deref()
            .map_or_else(|| "<span class=\"muted\">none</span>".to_owned(), esc),
        created = when(Some(&s.created_at)),
        updated = when(Some(&s.updated_at)),
        ran = dur(ran),
    );
    if let (Some(until), Some(ms)) = (&s.sleeping_until, s.sleeping_until_ms) {
        let _ = writeln!(
            out,
            "<dt>Sleeping</dt><dd id=\"sleeping\">until {} ({})</dd>",
            when(Some(until)),
            esc(&crate::time::from_now(ms, now))
        );
    }
    if let Some(w) = &s.waiting_for {
        let _ = writeln!(
            out,
            "<dt>Waiting for</dt><dd>the signal <code>{}</code></dd>",
            esc(w)
        );
    }
    if let Some(p) = &s.parent_id {
        let _ = writeln!(
            out,
            "<dt>Parent</dt><dd class=\"mono\"><a id=\"parent\" href=\"/sagas/{}\">{}</a> \
             <span class=\"muted\">(this is a child saga: a step of it)</span></dd>",
            pct(p),
            esc(p)
        );
    }
    if let Some(e) = &s.error {
        let _ = writeln!(
            out,
            "<dt>Error</dt><dd class=\"err\" id=\"error\">{}</dd>",
            esc(e)
        );
    }
    out += &spending(doc);
    if let Some(base) = jaeger {
        let href = jaeger_link(base, doc, now);
        let _ = writeln!(
            out,
            "<dt>Trace</dt><dd><a id=\"trace\" href=\"{}\" target=\"_blank\" rel=\"noopener noreferrer\" \
             title=\"Jaeger, spans tagged saga.id; the service is taken to be the saga's name\">open in Jaeger ↗</a></dd>",
            esc(&href)
        );
    }
    out += "</dl>\n";
    out += &super::rewind::rewinds(doc);

    // Actions.
    out += "<div class=\"actions\" id=\"actions\">";
    let allowed = doc.actions();
    if allowed.is_empty() {
        let why = match state {
            Some(SagaState::Running) => "is past its pivot and can only go forward",
            Some(SagaState::Compensating) => "is undoing its steps",
            _ => "is finished",
        };
        let _ = write!(
            out,
            "<span class=\"muted\">No action: a {} saga {why}.</span>",
            esc(s.state)
        );
    }
    for a in allowed {
        let (label, class, question) = match (a, state) {
            (Action::Abort, Some(SagaState::Stuck)) => (
                "Abort",
                "danger",
                "Give up on this saga? A saga stuck after its pivot ends as aborted; one stuck compensating stops there as aborted.",
            ),
            (Action::Abort, _) => (
                "Abort",
                "danger",
                "Abort this saga? The steps it has taken are compensated, in reverse.",
            ),
            (Action::Retry, _) => (
                "Retry",
                "",
                "Retry this saga's failed compensation (or failed step after the pivot) now?",
            ),
            (Action::Skip, _) => (
                "Skip",
                "danger",
                "Mark this saga's failed compensation as done by hand, and go on compensating? Only if you undid it yourself.",
            ),
        };
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/sagas/{href}/{act}\" data-confirm=\"{q} ({name} {id})\">\
             <button type=\"submit\" class=\"{class}\" name=\"{act}\" id=\"action-{act}\">{label}</button></form>",
            href = pct(&s.id),
            act = a.as_str(),
            q = esc(question),
            name = esc(&s.name),
            id = esc(&s.id),
        );
    }
    if state.is_some_and(|st| !st.is_terminal()) {
        let _ = write!(
            out,
            "<a class=\"muted\" href=\"/sagas/{}\">reload</a>",
            pct(&s.id)
        );
    }
    out += "</div>\n";
    out += &pause_form(doc, state);
    out += &super::rewind::rewind_form(doc, state);

    out += "<h2>Timeline</h2>\n";
    out += &timeline(doc, state.is_some_and(|st| !st.is_terminal()), now);
    out += "<h2>Steps and compensation ledger</h2>\n";
    out += &ledger(&doc.steps);
    if !doc.children.is_empty() {
        out += "<h2>Child sagas</h2>\n";
        out += &super::views::saga_table(&doc.children, "children");
    }
    out += "<h2>Data</h2>\n";
    let data = serde_json::to_string_pretty(&doc.data).unwrap_or_default();
    let _ = writeln!(out, "<pre class=\"json\" id=\"data\">{}</pre>", esc(&data));
    out
}

/// Resume for a paused saga, Pause (with its reason) for one that is not finished.
fn pause_form(doc: &ShowDoc, state: Option<SagaState>) -> String {
    let s = &doc.saga;
    let (act, label, question, field) = if s.paused.is_some() {
        (
            "resume",
            "Resume",
            "Resume this saga? What its pause held back goes out.",
            "",
        )
    } else if state.is_some_and(|st| !st.is_terminal()) {
        (
            "pause",
            "Pause",
            "Pause this saga? It sends nothing new until it is resumed.",
            "<input type=\"text\" name=\"reason\" id=\"pause-reason\" required maxlength=\"500\" \
             placeholder=\"why pause it?\" aria-label=\"Why pause it\">",
        )
    } else {
        return String::new();
    };
    format!(
        "<div class=\"actions\" id=\"pause-actions\"><form method=\"post\" action=\"/sagas/{href}/{act}\" \
         data-confirm=\"{q} ({name} {id})\">{field}<button type=\"submit\" class=\"quiet\" name=\"{act}\" \
         id=\"action-{act}\">{label}</button></form></div>\n",
        href = pct(&s.id),
        q = esc(question),
        name = esc(&s.name),
        id = esc(&s.id),
    )
}

/// The facts of what the saga used and may use; a saga held by its spent budget says
/// so, and how a person raises it.
fn spending(doc: &ShowDoc) -> String {
    let sp = &doc.spending;
    let mut out = format!(
        "<dt>Usage</dt><dd id=\"usage\">{}</dd>\n",
        esc(&usage_text(&sp.usage))
    );
    if let Some(b) = &sp.budget {
        let _ = writeln!(
            out,
            "<dt>Budget</dt><dd id=\"budget\">{}</dd>",
            esc(&budget_text(b, sp.on_spent))
        );
    }
    if let Some(why) = waiting_text(&doc.saga.id, sp) {
        let lead = if sp.spent.is_some() {
            "Waiting for a person to raise its budget: "
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "<dt>Held</dt><dd class=\"err\" id=\"waiting-for-raise\">{lead}{}</dd>",
            esc(&why)
        );
    }
    out
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// `{jaeger}/search?service=<saga name>&tags={"saga.id":"<id>"}` over the saga's time
/// (from a minute before its start to an hour after its last change).
fn jaeger_link(base: &str, doc: &ShowDoc, now: i64) -> String {
    let s = &doc.saga;
    let tags = serde_json::json!({ "saga.id": s.id }).to_string();
    let start_us = (s.created_at_ms - 60_000) * 1000;
    let end_us = (s.updated_at_ms + 3_600_000).min(now.max(s.updated_at_ms) + 60_000) * 1000;
    format!(
        "{}/search?service={}&tags={}&lookback=custom&start={start_us}&end={end_us}&limit=20",
        base.trim_end_matches('/'),
        pct(&s.name),
        pct(&tags)
    )
}

/// Every step with its ledger entry, as stored.
fn ledger(steps: &[StepDoc]) -> String {
    let mut out = String::from(
        "<table id=\"ledger\">\n<thead><tr><th>#</th><th>Step</th><th>To</th><th>State</th><th>Attempts</th>\
         <th>Dispatched</th><th>Replied</th><th>Compensation</th><th>Undo state</th><th>Undo attempts</th>\
         <th>Compensated</th><th>Usage</th></tr></thead>\n<tbody>\n",
    );
    for st in steps {
        let payload = st
            .compensation_payload
            .as_ref()
            .map(|p| serde_json::to_string_pretty(p).unwrap_or_default());
        let comp = match (&st.compensation_destination, payload) {
            (Some(d), Some(p)) => format!(
                "<code>{}</code><details><summary>payload</summary><pre class=\"json\">{}</pre></details>",
                esc(d),
                esc(&p)
            ),
            (Some(d), None) => format!("<code>{}</code>", esc(d)),
            (None, _) => "<span class=\"muted\">–</span>".to_owned(),
        };
        let err = |e: &Option<String>| {
            e.as_deref().map_or_else(String::new, |e| {
                format!("<div class=\"err\">{}</div>", esc(e))
            })
        };
        let _ = writeln!(
            out,
            "<tr><td>{idx}<span class=\"muted\">/{stage}</span></td><td>{name}</td><td><code>{dest}</code></td>\
             <td>{state}{err}</td><td>{attempts}</td><td>{disp}</td><td>{repl}</td><td>{comp}</td>\
             <td>{cstate}{cerr}</td><td>{cattempts}</td><td>{comped}</td><td>{usage}</td></tr>",
            idx = st.idx,
            stage = st.stage,
            name = esc(&st.name),
            dest = esc(&st.destination),
            state = esc(&st.state),
            err = err(&st.error),
            attempts = st.attempts,
            disp = clock(st.dispatched_at.as_deref()),
            repl = clock(st.replied_at.as_deref()),
            cstate = esc(st.compensation_state.as_deref().unwrap_or("")),
            cerr = err(&st.compensation_error),
            cattempts = st.compensation_attempts,
            comped = clock(st.compensated_at.as_deref()),
            usage = if st.usage.is_zero() {
                "<span class=\"muted\">–</span>".to_owned()
            } else {
                esc(&usage_text(&st.usage))
            },
        );
    }
    out += "</tbody>\n</table>\n";
    out
}
