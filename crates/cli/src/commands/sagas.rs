//! `agentsaga sagas list | show | signal`: tables, or the console's documents as JSON
//! (`show` with the saga's rewinds).

use agentsaga_console::Console;
use agentsaga_console::ops::{SagaQuery, ShowDoc, budget_text, usage_text, waiting_text};
use agentsaga_saga::{SagaId, SagaState, Signal};

use crate::args::SagasList;
use crate::format::print_json;
use crate::format::{Table, or_dash, truncate, ts_or_dash};

pub(super) async fn list(console: &Console, args: SagasList) -> anyhow::Result<()> {
    let query = SagaQuery {
        state: args.state,
        name: args.name,
        key: args.key,
        waiting: args.waiting,
        sleeping: args.sleeping,
        parent: args.parent,
        stalled: args.stalled,
        cursor: args.cursor,
        limit: args.limit,
        ..SagaQuery::default()
    };
    let page = console.sagas(&query).await?;
    if args.json.json {
        return print_json(&page);
    }
    if page.sagas.is_empty() {
        outln!("no sagas");
        return Ok(());
    }
    let mut table = Table::new(&[
        "ID", "NAME", "VERSION", "STATE", "WAITING", "KEY", "CREATED", "UPDATED", "ERROR",
    ])
    .right(&[2]);
    for s in &page.sagas {
        table.row(vec![
            s.id.clone(),
            s.name.clone(),
            s.version.to_string(),
            s.state.to_owned(),
            match (&s.paused, &s.waiting_for, &s.sleeping_until) {
                (Some(p), _, _) => format!("paused by {}", p.by),
                (None, Some(w), _) => w.clone(),
                (None, None, Some(until)) => format!("sleeps until {until}"),
                (None, None, None) => "-".to_owned(),
            },
            truncate(&or_dash(s.key.as_deref()), 40),
            s.created_at.clone(),
            s.updated_at.clone(),
            truncate(&or_dash(s.error.as_deref()), 60),
        ]);
    }
    out!("{}", table.render());
    if let Some(next) = &page.next_cursor {
        outln!("more: --cursor {next}");
    }
    Ok(())
}

pub(super) async fn show(console: &Console, id: SagaId, json: bool) -> anyhow::Result<()> {
    let doc = console.saga(id).await?;
    if json {
        return print_json(&doc);
    }
    print_saga(&doc);
    Ok(())
}

/// A saga as `sagas show` prints it (and `sagas raise-budget`, after it acts).
pub(super) fn print_saga(doc: &ShowDoc) {
    let (saga, steps) = (&doc.saga, &doc.steps);
    let id = &saga.id;
    outln!("saga     {id}");
    outln!("name     {} (version {})", saga.name, saga.version);
    outln!("state    {}", saga.state);
    if let Some(p) = &saga.paused {
        outln!("paused   by {} at {}: {}", p.by, p.at, p.reason);
    }
    outln!("key      {}", or_dash(saga.key.as_deref()));
    if let Some(signal) = &saga.waiting_for {
        outln!("waiting  for signal `{signal}`");
    }
    if let Some(until) = &saga.sleeping_until {
        outln!("sleeping until {until}");
    }
    if let Some(parent) = &saga.parent_id {
        outln!("parent   {parent} (this is a child saga: `sagas show {parent}`)");
    }
    outln!("error    {}", or_dash(saga.error.as_deref()));
    let spending = &doc.spending;
    outln!("usage    {}", usage_text(&spending.usage));
    if let Some(budget) = &spending.budget {
        outln!("budget   {}", budget_text(budget, spending.on_spent));
    }
    if let Some(why) = waiting_text(id, spending) {
        outln!("held     {why}");
    }
    outln!("created  {}", saga.created_at);
    outln!("updated  {}", saga.updated_at);
    outln!("data     {}", doc.data);
    outln!();
    outln!("TIMELINE");
    let mut timeline = Table::new(&[
        "IDX",
        "STAGE",
        "STEP",
        "DESTINATION",
        "STATE",
        "ATTEMPTS",
        "DISPATCHED",
        "REPLIED",
        "USAGE",
        "ERROR",
    ])
    .right(&[0, 1, 5]);
    for s in steps {
        timeline.row(vec![
            s.idx.to_string(),
            s.stage.to_string(),
            s.name.clone(),
            s.destination.clone(),
            s.state.clone(),
            s.attempts.to_string(),
            ts_or_dash(s.dispatched_at_ms),
            ts_or_dash(s.replied_at_ms),
            if s.usage.is_zero() {
                "-".to_owned()
            } else {
                usage_text(&s.usage)
            },
            or_dash(s.error.as_deref()),
        ]);
    }
    out!("{}", timeline.render());
    outln!();
    outln!("COMPENSATION LEDGER");
    let mut ledger = Table::new(&[
        "IDX",
        "STEP",
        "DESTINATION",
        "STATE",
        "ATTEMPTS",
        "COMPENSATED",
        "ERROR",
        "PAYLOAD",
    ])
    .right(&[0, 4]);
    for s in steps.iter().filter(|s| s.compensation_state.is_some()) {
        ledger.row(vec![
            s.idx.to_string(),
            s.name.clone(),
            or_dash(s.compensation_destination.as_deref()),
            or_dash(s.compensation_state.as_deref()),
            s.compensation_attempts.to_string(),
            ts_or_dash(s.compensated_at_ms),
            or_dash(s.compensation_error.as_deref()),
            s.compensation_payload
                .as_ref()
                .map_or_else(|| "-".to_owned(), ToString::to_string),
        ]);
    }
    if ledger.is_empty() {
        outln!("(no compensations recorded)");
    } else {
        out!("{}", ledger.render());
    }
    if !doc.children.is_empty() {
        outln!();
        outln!("CHILDREN");
        let mut children = Table::new(&["ID", "NAME", "STATE", "UPDATED", "ERROR"]);
        for c in &doc.children {
            children.row(vec![
                c.id.clone(),
                c.name.clone(),
                c.state.to_owned(),
                c.updated_at.clone(),
                truncate(&or_dash(c.error.as_deref()), 60),
            ]);
        }
        out!("{}", children.render());
    }
    print_rewinds(doc);
    if saga.paused.is_some() {
        outln!();
        outln!("paused: it sends nothing new until `agentsaga sagas resume {id}`");
    }
    if saga.state == SagaState::Stuck.as_str() {
        outln!();
        if steps
            .iter()
            .any(|s| s.compensation_state.as_deref() == Some("failed"))
        {
            outln!(
                "a compensation failed: `agentsaga sagas retry {id}` to try it again, or undo \
                 it by hand and `agentsaga sagas skip {id}`"
            );
        } else {
            outln!(
                "a step after the pivot failed: retry it from a process that has the saga's \
                 definition, or give up with `agentsaga sagas abort {id}`"
            );
        }
    }
}

/// The saga's rewinds, oldest first (nothing for a saga never rewound): to which
/// step, who, when and why; the steps each undid (and how their compensation ended)
/// once done, `under way` before.
fn print_rewinds(doc: &ShowDoc) {
    if doc.rewinds.is_empty() {
        return;
    }
    outln!();
    outln!("REWINDS");
    for r in &doc.rewinds {
        let lead = if r.under_way() {
            "rewinding"
        } else {
            "rewound"
        };
        outln!("{lead} to `{}` by {} at {}: {}", r.to, r.by, r.at, r.reason);
        match &r.done_at {
            None => outln!(
                "  under way: the steps from `{}` on are undone, then it runs again from there",
                r.to
            ),
            Some(done) => {
                let undone: Vec<String> = r
                    .undone
                    .iter()
                    .map(|u| format!("{} ({})", u.name, or_dash(u.compensation.as_deref())))
                    .collect();
                if undone.is_empty() {
                    outln!("  undid nothing; done at {done}");
                } else {
                    outln!("  undid {}; done at {done}", undone.join(", "));
                }
            }
        }
    }
}

/// `sagas signal ID NAME [--data JSON | --reject REASON]`.
pub(super) async fn signal(
    console: &Console,
    id: SagaId,
    name: &str,
    data: Option<String>,
    reject: Option<String>,
) -> anyhow::Result<()> {
    let signal = match (reject, data) {
        (Some(reason), _) => Signal::Reject(reason),
        (None, Some(data)) => Signal::Approve(
            serde_json::from_str(&data).map_err(|e| anyhow::anyhow!("--data is not JSON: {e}"))?,
        ),
        (None, None) => Signal::Approve(serde_json::Value::Null),
    };
    let doc = console.signal(id, name, signal).await?;
    match doc.receipt {
        "duplicate" => outln!("saga {id} already had its signal `{name}`: nothing changed"),
        _ => outln!("signal `{name}` sent to saga {id}"),
    }
    Ok(())
}
