//! A saga's rewinds on its page: a line for each (who rewound it to which step, and
//! why; "Rewinding to …" while its undos go on), and the "Rewind to" form of a running
//! saga: the steps it has taken to choose from, and a reason.

use std::fmt::Write as _;

use agentsaga_saga::SagaState;

use super::html::{esc, pct, when};
use crate::ops::ShowDoc;

/// A line for each of the saga's rewinds, oldest first; nothing for a saga never
/// rewound.
pub(super) fn rewinds(doc: &ShowDoc) -> String {
    if doc.rewinds.is_empty() {
        return String::new();
    }
    let mut out = String::from("<ul class=\"rewinds\" id=\"rewinds\">\n");
    for r in &doc.rewinds {
        let (to, by, reason) = (esc(&r.to), esc(&r.by), esc(&r.reason));
        if r.under_way() {
            let _ = writeln!(
                out,
                "<li id=\"rewinding\">Rewinding to <code>{to}</code> by {by}: {reason} \
                 <span class=\"muted\">(asked at {at}: the steps from <code>{to}</code> on \
                 are undone, then it runs again from there)</span></li>",
                at = when(Some(&r.at)),
            );
        } else {
            let undone: Vec<String> = r.undone.iter().map(|u| esc(&u.name)).collect();
            let undone = if undone.is_empty() {
                "nothing to undo".to_owned()
            } else {
                format!("undid {}", undone.join(", "))
            };
            let _ = writeln!(
                out,
                "<li class=\"rewound\">Rewound to <code>{to}</code> by {by}: {reason} \
                 <span class=\"muted\">(at {at}; {undone})</span></li>",
                at = when(Some(&r.at)),
            );
        }
    }
    out += "</ul>\n";
    out
}

/// "Rewind to" for a running saga that has taken a step and is not past its pivot: a
/// choice of the steps it has taken, a reason, and the button. The engine refuses (the
/// page then says why) a step of the chosen stage or a later one in flight: pause the
/// saga first, and rewind once they answered.
pub(super) fn rewind_form(doc: &ShowDoc, state: Option<SagaState>) -> String {
    // The pivot and the steps after it are the rows without a compensation entry.
    let past_pivot = doc.steps.iter().any(|s| s.compensation_state.is_none());
    if state != Some(SagaState::Running) || past_pivot || doc.steps.is_empty() {
        return String::new();
    }
    let mut names: Vec<&str> = Vec::new();
    for st in &doc.steps {
        if !names.contains(&st.name.as_str()) {
            names.push(&st.name);
        }
    }
    let options: String = names
        .iter()
        .map(|n| format!("<option value=\"{0}\">{0}</option>", esc(n)))
        .collect();
    let s = &doc.saga;
    format!(
        "<div class=\"actions\" id=\"rewind-actions\"><form method=\"post\" \
         action=\"/sagas/{href}/rewind\" data-confirm=\"{q} ({name} {id})\">\
         <label for=\"rewind-to\">Rewind to</label> <select name=\"to\" id=\"rewind-to\" required>\
         {options}</select> <input type=\"text\" name=\"reason\" id=\"rewind-reason\" required \
         maxlength=\"500\" placeholder=\"why rewind it?\" aria-label=\"Why rewind it\"> \
         <button type=\"submit\" class=\"quiet\" name=\"rewind\" id=\"action-rewind\">Rewind</button>\
         </form></div>\n",
        href = pct(&s.id),
        q = esc(
            "Rewind this saga? The chosen step and every step after it are undone by their \
             compensations, then it runs again from that step."
        ),
        name = esc(&s.name),
        id = esc(&s.id),
    )
}
