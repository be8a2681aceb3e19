//! `agentsaga status`.

use agentsaga_console::Console;
use agentsaga_console::ops::SAGA_STATES;

use crate::format::print_json;
use crate::format::{Table, compact_duration, human_duration};

pub(super) async fn run(console: &Console, json: bool) -> anyhow::Result<()> {
    let doc = console.status().await?;
    if json {
        return print_json(&doc);
    }
    outln!("backend: {}", doc.backend);
    outln!();
    let mut outbox = Table::new(&["OUTBOX", "ROWS"]).right(&[1]);
    for (name, n) in [
        ("pending", doc.outbox.pending),
        ("in_flight", doc.outbox.in_flight),
        ("delivered", doc.outbox.delivered),
        ("dead", doc.outbox.dead),
    ] {
        outbox.row(vec![name.into(), n.to_string()]);
    }
    out!("{}", outbox.render());
    outln!();
    match doc.outbox.oldest_pending_age_ms {
        Some(ms) => outln!("oldest ready pending row: waiting {}", human_duration(ms)),
        None => outln!("oldest ready pending row: none (nothing waiting)"),
    }
    let hint = if doc.dead_letters > 0 {
        " (see `agentsaga dead list`)"
    } else {
        ""
    };
    outln!("dead letters: {}{hint}", doc.dead_letters);
    outln!();
    let mut table = Table::new(&["SAGAS", "COUNT"]).right(&[1]);
    for state in SAGA_STATES {
        let n = doc.sagas.get(state.as_str()).copied().unwrap_or_default();
        table.row(vec![state.as_str().into(), n.to_string()]);
    }
    table.row(vec!["total".into(), doc.sagas_total.to_string()]);
    out!("{}", table.render());
    let waiting: u64 = doc.starts_waiting.values().sum();
    if waiting > 0 {
        outln!();
        let per_name: Vec<String> = doc
            .starts_waiting
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        outln!(
            "starts waiting for room (admission bound): {waiting} ({})",
            per_name.join(", ")
        );
    } else {
        outln!("starts waiting for room (admission bound): 0");
    }
    let set_aside: u64 = doc.starts_set_aside.values().sum();
    if set_aside > 0 {
        let per_name: Vec<String> = doc
            .starts_set_aside
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        outln!(
            "starts set aside (could not start when their turn came): {set_aside} ({}) \
             (see `agentsaga starts list`)",
            per_name.join(", ")
        );
    }
    outln!(
        "stalled sagas (running, nothing live or no progress for {}): {}{}",
        compact_duration(console.stalled_threshold()),
        doc.stalled,
        if doc.stalled > 0 {
            " (see `agentsaga sagas list --stalled`)"
        } else {
            ""
        }
    );
    if doc.sagas.get("stuck").copied().unwrap_or_default() > 0 {
        outln!();
        outln!("stuck sagas need an operator: `agentsaga sagas list --state stuck`");
    }
    if let Some(remote) = &doc.remote {
        outln!();
        super::remote::print(remote);
    }
    Ok(())
}
