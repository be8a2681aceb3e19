//! One saga's timeline: its steps and waits, then its compensations, as bars over its
//! life.

use std::fmt::Write as _;

use super::html::{dur, esc};
use super::views::short;
use crate::ops::{ShowDoc, StepDoc};

/// A wait for a signal, or a sleep: drawn alike (nothing is sent to an agent).
fn is_wait(step: &StepDoc) -> bool {
    step.destination.starts_with("signal:") || step.destination.starts_with("sleep:")
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
pub(super) fn timeline(doc: &ShowDoc, live: bool, now: i64) -> String {
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
        let sleep = st.destination.starts_with("sleep:");
        let what = if sleep {
            match (open, st.wakes_at.as_deref(), st.wakes_at_ms) {
                (true, Some(at), Some(ms)) => {
                    format!("sleeps until {at}, {}", crate::time::from_now(ms, now))
                }
                _ if st.state == "succeeded" => {
                    format!("slept until {}", st.wakes_at.as_deref().unwrap_or("–"))
                }
                _ => format!(
                    "was to sleep until {}",
                    st.wakes_at.as_deref().unwrap_or("–")
                ),
            }
        } else if wait {
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
            if sleep {
                "woke"
            } else if wait {
                "signalled"
            } else {
                "replied"
            },
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
            <span><i class=\"tl-bar wait\"></i>wait for a signal or a time</span><span><i class=\"tl-bar comp done\"></i>compensated</span>\
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
