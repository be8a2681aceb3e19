//! `agentsaga dead list | show | redrive | purge`.

use std::time::Duration;

use agentsaga_console::Console;
use agentsaga_core::MessageId;

use crate::format::print_json;
use crate::format::{Table, compact_duration, or_dash, truncate};

pub(super) async fn list(
    console: &Console,
    destination: Option<&str>,
    before: Option<i64>,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    let doc = console
        .dead_letters_before(destination, before, limit)
        .await?;
    if json {
        return print_json(&doc);
    }
    if doc.dead_letters.is_empty() {
        outln!("no dead letters");
        return Ok(());
    }
    let mut table = Table::new(&[
        "ID",
        "DESTINATION",
        "KEY",
        "ATTEMPTS",
        "CREATED",
        "LAST ERROR",
        "MOOT",
    ])
    .right(&[3]);
    for d in &doc.dead_letters {
        table.row(vec![
            d.id.clone(),
            d.destination.clone(),
            or_dash(d.key.as_deref()),
            d.attempts.to_string(),
            d.created_at.clone(),
            truncate(&or_dash(d.last_error.as_deref()), 60),
            truncate(&or_dash(d.moot.as_deref()), 50),
        ]);
    }
    out!("{}", table.render());
    if let Some(before) = doc.next_before {
        outln!("more: --before {before}");
    }
    Ok(())
}

pub(super) async fn show(console: &Console, id: MessageId, json: bool) -> anyhow::Result<()> {
    let doc = console.dead_letter(id).await?;
    if json {
        return print_json(&doc);
    }
    outln!("id           {}", doc.id);
    outln!("seq          {}", doc.seq);
    outln!("destination  {}", doc.destination);
    outln!("key          {}", or_dash(doc.key.as_deref()));
    outln!("attempts     {}", doc.attempts);
    outln!("created      {}", doc.created_at);
    outln!("last error   {}", or_dash(doc.last_error.as_deref()));
    outln!(
        "moot         {}",
        doc.moot.as_deref().unwrap_or("no (re-driving it is safe)")
    );
    outln!();
    if doc.headers.is_empty() {
        outln!("(no headers)");
    } else {
        let mut headers = Table::new(&["HEADER", "VALUE"]);
        for (k, v) in &doc.headers {
            headers.row(vec![k.clone(), v.clone()]);
        }
        out!("{}", headers.render());
    }
    outln!();
    outln!("payload:");
    outln!("{}", serde_json::to_string_pretty(&doc.payload)?);
    Ok(())
}

pub(super) async fn redrive(
    console: &Console,
    id: Option<MessageId>,
    destination: Option<&str>,
    force: bool,
) -> anyhow::Result<()> {
    match id {
        Some(id) => {
            let doc = match console.redrive(id, force).await {
                Err(agentsaga_console::Error::Refused(why)) => {
                    anyhow::bail!("{why} (`--force` purges it instead)")
                }
                other => other?,
            };
            match doc.moot {
                Some(why) => outln!("purged dead letter {id} as moot: {why}"),
                None => outln!("re-drove dead letter {id}: pending again, attempts reset"),
            }
        }
        None => {
            let doc = console.redrive_all(destination, force).await?;
            let scope = destination.map_or_else(String::new, |d| format!(" to `{d}`"));
            outln!(
                "re-drove {} dead letter(s){scope}: pending again, attempts reset",
                doc.redriven
            );
            if doc.purged > 0 {
                outln!("purged {} moot dead letter(s)", doc.purged);
            }
            for r in &doc.refused {
                outln!("refused {}: {}", r.id, r.reason);
            }
            if !doc.refused.is_empty() {
                outln!(
                    "{} moot dead letter(s) left as they are (`--force` purges them)",
                    doc.refused.len()
                );
            }
        }
    }
    Ok(())
}

pub(super) async fn purge(console: &Console, older_than: Duration) -> anyhow::Result<()> {
    let doc = console.purge_older(older_than).await?;
    outln!(
        "purged {} dead letter(s) created more than {} ago",
        doc.purged,
        compact_duration(older_than)
    );
    Ok(())
}
