//! One saga's page: what it is, the actions its state allows, its steps as a timeline,
//! its compensation ledger and its data.

use std::fmt::Write as _;

use agentsaga_saga::{SagaId, SagaState};
use axum::http::StatusCode;
use axum::response::Response;

use super::html::{Nav, badge, clock, dur, error_page, esc, pct, when};
use super::{fail, views::short};
use crate::ops::{ShowDoc, StepDoc};
use crate::{Action, Console, Error};

/// What the page says above the saga.
pub(crate) enum Notice {
    /// The action was done (the page shows the saga as it now stands).
    Done(Action),
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
    let now = agentsaga_core::clock::now_ms();
    let title = format!("{} {}", doc.saga.name, short(&doc.saga.id, 13));
    let body = render(&doc, jaeger, notice.as_ref(), now);
    super::html::page(StatusCode::OK, &title, Nav::Sagas, &body)
}

fn render(doc: &ShowDoc, jaeger: Option<&str>, notice: Option<&Notice>, now: i64) -> String {
    let s = &doc.saga;
    let state: Option<SagaState> = s.state.parse().ok();
    let mut out = format!(
        "<h1><span>{}</span> <span class=\"muted\">v{}</span> <span id=\"state\">{}</span></h1>\n",
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
    if let Some(w) = &s.waiting_for {
        let _ = writeln!(
            out,
            "<dt>Waiting for</dt><dd>the signal <code>{}</code></dd>",
            esc(w)
        );
    }
    if let Some(e) = &s.error {
        let _ = writeln!(
            out,
            "<dt>Error</dt><dd class=\"err\" id=\"error\">{}</dd>",
            esc(e)
        );
    }
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

    out += "<h2>Timeline</h2>\n";
    out += &timeline(doc, state.is_some_and(|st| !st.is_terminal()), now);
    out += "<h2>Steps and compensation ledger</h2>\n";
    out += &ledger(&doc.steps);
    out += "<h2>Data</h2>\n";
    let data = serde_json::to_string_pretty(&doc.data).unwrap_or_default();
    let _ = writeln!(out, "<pre class=\"json\" id=\"data\">{}</pre>", esc(&data));
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

fn is_wait(step: &StepDoc) -> bool {
    step.destination.starts_with("signal:")
}

/// One bar of the timeline.
struct Bar<'a> {
    kind: &'static str,
    step: &'a StepDoc,
    state: &'a str,
    start: Option<i64>,
    end: Option<i64>,
    /// Still going: the bar runs to now.
    open: bool,
    label: String,
    title: String,
}

/// The steps as bars over the saga's life: the forward steps and waits in index
/// order, each from its dispatch to its reply; then the compensations in the order
/// they run, latest stage first, each ending when it was done.
fn timeline(doc: &ShowDoc, live: bool, now: i64) -> String {
    let s = &doc.saga;
    let t0 = s.created_at_ms;
    let mut t1 = s.updated_at_ms;
    for st in &doc.steps {
        for t in [st.dispatched_at_ms, st.replied_at_ms, st.compensated_at_ms]
            .into_iter()
            .flatten()
        {
            t1 = t1.max(t);
        }
    }
    if live {
        t1 = t1.max(now);
    }
    let span = (t1 - t0).max(1);

    let mut forward = Vec::new();
    for st in &doc.steps {
        let wait = is_wait(st);
        let open = st.state == "dispatched";
        let end = st
            .replied_at_ms
            .or(if open {
                Some(t1)
            } else {
                Some(s.updated_at_ms)
            })
            .filter(|_| st.dispatched_at_ms.is_some());
        let what = if wait {
            format!(
                "waits for the signal {}",
                st.destination.trim_start_matches("signal:")
            )
        } else {
            format!("→ {}", st.destination)
        };
        let mut label = format!("{what} · stage {}", st.stage);
        if st.attempts > 1 {
            let _ = write!(label, " · {} attempts", st.attempts);
        }
        let title = format!(
            "{}: {}; dispatched {}, {} {}",
            st.name,
            st.state,
            st.dispatched_at.as_deref().unwrap_or("–"),
            if wait { "signalled" } else { "replied" },
            st.replied_at.as_deref().unwrap_or("not yet"),
        );
        forward.push(Bar {
            kind: if wait { "wait" } else { "step" },
            step: st,
            state: &st.state,
            start: st.dispatched_at_ms,
            end,
            open,
            label,
            title,
        });
    }

    // The compensations that were needed, in the order they run.
    let mut comps: Vec<&StepDoc> = doc
        .steps
        .iter()
        .filter(|st| {
            matches!(
                st.compensation_state.as_deref(),
                Some("dispatched" | "done" | "skipped" | "failed")
            )
        })
        .collect();
    comps.sort_by_key(|st| std::cmp::Reverse((st.stage, st.idx)));
    // When the saga turned back: its last forward event (the failure; an abort's own
    // time is not recorded, so for an abort this is a lower bound).
    let turned_back = doc
        .steps
        .iter()
        .filter_map(|st| st.replied_at_ms.or(st.dispatched_at_ms))
        .max()
        .unwrap_or(t0);
    let mut backward = Vec::new();
    for st in &comps {
        // A compensation's dispatch time is not recorded: its bar starts when the
        // later stages' compensations were all done (or the saga turned back).
        let start = comps
            .iter()
            .filter(|o| o.stage > st.stage)
            .filter_map(|o| o.compensated_at_ms)
            .max()
            .unwrap_or(turned_back);
        let cstate = st.compensation_state.as_deref().unwrap_or("");
        let open = cstate == "dispatched";
        let end = st
            .compensated_at_ms
            .unwrap_or(if open { t1 } else { s.updated_at_ms });
        let mut label = format!(
            "undo → {} · stage {}",
            st.compensation_destination.as_deref().unwrap_or("?"),
            st.stage
        );
        if st.compensation_attempts > 1 {
            let _ = write!(label, " · {} attempts", st.compensation_attempts);
        }
        let title = format!(
            "compensation of {}: {}; done {} (its dispatch time is not recorded: the bar starts when the later stage's undo finished, or when the saga turned back)",
            st.name,
            cstate,
            st.compensated_at.as_deref().unwrap_or("not yet"),
        );
        backward.push(Bar {
            kind: "compensation",
            step: st,
            state: cstate,
            start: Some(start.min(end)),
            end: Some(end),
            open,
            label,
            title,
        });
    }

    let mut out = format!(
        "<div class=\"timeline\" id=\"timeline\" data-t0=\"{t0}\" data-t1=\"{t1}\">\n\
         <div class=\"tl-row tl-head\"><div>step</div><div class=\"tl-axis\">"
    );
    for q in 0..=4 {
        let _ = write!(out, "<span>{}</span>", dur(span * q / 4));
    }
    out += "</div><div class=\"tl-dur\">took</div></div>\n";
    out += "<div class=\"tl-section\">Forward</div>\n";
    if forward.is_empty() {
        out += "<p class=\"muted\">No step dispatched yet.</p>\n";
    }
    for b in &forward {
        out += &bar_row(b, t0, span);
    }
    if !backward.is_empty() {
        out += "<div class=\"tl-section\">Compensations, in the order they ran (reverse)</div>\n";
        for b in &backward {
            out += &bar_row(b, t0, span);
        }
    }
    out += "<div class=\"legend\"><span><i class=\"tl-bar succeeded\"></i>succeeded</span>\
            <span><i class=\"tl-bar failed\"></i>failed</span><span><i class=\"tl-bar dispatched\"></i>in flight</span>\
            <span><i class=\"tl-bar wait\"></i>wait for a signal</span><span><i class=\"tl-bar comp done\"></i>compensated</span>\
            <span><i class=\"tl-bar comp skipped\"></i>skipped by an operator</span></div>\n</div>\n";
    out
}

fn bar_row(b: &Bar<'_>, t0: i64, span: i64) -> String {
    let st = b.step;
    let err = if b.kind == "compensation" {
        st.compensation_error.as_deref()
    } else {
        st.error.as_deref()
    };
    let err = err.map_or_else(String::new, |e| {
        format!(
            "<span class=\"err\" title=\"{}\">{}</span>",
            esc(e),
            esc(&short(e, 90))
        )
    });
    let (track, took) = match (b.start, b.end) {
        (Some(a), Some(z)) => {
            let left = (a - t0) as f64 / span as f64 * 100.0;
            let width = ((z - a).max(0) as f64 / span as f64 * 100.0).min(100.0 - left);
            let class = match b.kind {
                "compensation" => format!("comp {}", esc(b.state)),
                "wait" => format!("wait {}", esc(b.state)),
                _ => esc(b.state),
            };
            let took = if b.open {
                format!("{}+", dur(z - a))
            } else {
                dur(z - a)
            };
            (
                format!(
                    "<div class=\"tl-bar {class}\" style=\"left:{left:.3}%;width:{width:.3}%\" title=\"{}\"></div>",
                    esc(&b.title)
                ),
                took,
            )
        }
        _ => (String::new(), "–".to_owned()),
    };
    format!(
        "<div class=\"tl-row\" data-kind=\"{kind}\" data-step=\"{name}\" data-idx=\"{idx}\" data-stage=\"{stage}\" \
         data-state=\"{state}\" data-start-ms=\"{start}\" data-end-ms=\"{end}\">\
         <div class=\"tl-label\"><span class=\"name\">{name}</span> <span class=\"sub\">{label}</span>{err}</div>\
         <div class=\"tl-track\">{track}</div><div class=\"tl-dur\">{took}</div></div>\n",
        kind = b.kind,
        name = esc(&st.name),
        idx = st.idx,
        stage = st.stage,
        state = esc(b.state),
        start = b.start.map(|t| t.to_string()).unwrap_or_default(),
        end = b.end.map(|t| t.to_string()).unwrap_or_default(),
        label = esc(&b.label),
    )
}

/// Every step with its ledger entry, as stored.
fn ledger(steps: &[StepDoc]) -> String {
    let mut out = String::from(
        "<table id=\"ledger\">\n<thead><tr><th>#</th><th>Step</th><th>To</th><th>State</th><th>Attempts</th>\
         <th>Dispatched</th><th>Replied</th><th>Compensation</th><th>Undo state</th><th>Undo attempts</th>\
         <th>Compensated</th></tr></thead>\n<tbody>\n",
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
             <td>{cstate}{cerr}</td><td>{cattempts}</td><td>{comped}</td></tr>",
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
        );
    }
    out += "</tbody>\n</table>\n";
    out
}
