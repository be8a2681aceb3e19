//! `agentsaga dead list | show | redrive | purge`.

use std::collections::BTreeMap;
use std::time::Duration;

use agentsaga_core::admin::DeadRow;
use agentsaga_core::{MessageId, Store};
use serde::Serialize;

use super::{json_value, print_json};
use crate::format::{Table, compact_duration, or_dash, rfc3339, truncate};

/// One dead letter in `dead list --json` (and the whole of `dead show --json`).
#[derive(Debug, Serialize)]
struct DeadDoc {
    id: String,
    seq: i64,
    destination: String,
    key: Option<String>,
    attempts: u32,
    created_at: String,
    created_at_ms: i64,
    last_error: Option<String>,
    headers: BTreeMap<String, String>,
    payload: serde_json::Value,
    /// Why re-driving it would be wrong (its saga has moved past it), if it would.
    moot: Option<String>,
}

impl DeadDoc {
    async fn of(store: &Store, d: &DeadRow) -> anyhow::Result<Self> {
        let mut doc = Self::from(d);
        doc.moot = agentsaga_saga::Engine::moot(store, &d.envelope).await?;
        Ok(doc)
    }
}

impl From<&DeadRow> for DeadDoc {
    fn from(d: &DeadRow) -> Self {
        let e = &d.envelope;
        Self {
            moot: None,
            id: e.id.to_string(),
            seq: e.seq,
            destination: e.destination.clone(),
            key: e.key.clone(),
            attempts: e.attempts,
            created_at: rfc3339(e.created_at_ms),
            created_at_ms: e.created_at_ms,
            last_error: d.last_error.clone(),
            headers: e.headers.clone(),
            payload: json_value(&e.payload),
        }
    }
}

#[derive(Debug, Serialize)]
struct ListDoc {
    dead_letters: Vec<DeadDoc>,
}

pub(super) async fn list(
    store: &Store,
    destination: Option<&str>,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    let rows = store.admin().dead_letters(destination, limit).await?;
    let mut docs = Vec::with_capacity(rows.len());
    for d in &rows {
        docs.push(DeadDoc::of(store, d).await?);
    }
    if json {
        return print_json(&ListDoc { dead_letters: docs });
    }
    if rows.is_empty() {
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
    for (d, doc) in rows.iter().zip(&docs) {
        let e = &d.envelope;
        table.row(vec![
            e.id.to_string(),
            e.destination.clone(),
            or_dash(e.key.as_deref()),
            e.attempts.to_string(),
            rfc3339(e.created_at_ms),
            truncate(&or_dash(d.last_error.as_deref()), 60),
            truncate(&or_dash(doc.moot.as_deref()), 50),
        ]);
    }
    out!("{}", table.render());
    Ok(())
}

pub(super) async fn show(store: &Store, id: MessageId, json: bool) -> anyhow::Result<()> {
    let rows = store.admin().dead_letters(None, u32::MAX).await?;
    let Some(row) = rows.iter().find(|d| d.envelope.id == id) else {
        anyhow::bail!("dead letter `{id}` not found");
    };
    let doc = DeadDoc::of(store, row).await?;
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
    store: &Store,
    id: Option<MessageId>,
    destination: Option<&str>,
    force: bool,
) -> anyhow::Result<()> {
    match id {
        Some(id) => {
            let rows = store.admin().dead_letters(None, u32::MAX).await?;
            let Some(row) = rows.iter().find(|d| d.envelope.id == id) else {
                anyhow::bail!("dead letter `{id}` not found");
            };
            match agentsaga_saga::Engine::moot(store, &row.envelope).await? {
                Some(why) if force => {
                    store.admin().purge_dead_letter(id).await?;
                    outln!("purged dead letter {id} as moot: {why}");
                }
                Some(why) => anyhow::bail!(
                    "refused to re-drive dead letter {id}: {why}. Re-driving it could undo what its saga decided; `--force` purges it instead"
                ),
                None => {
                    store.admin().redrive(id).await?;
                    outln!("re-drove dead letter {id}: pending again, attempts reset");
                }
            }
        }
        None => {
            let rows = store.admin().dead_letters(destination, u32::MAX).await?;
            let (mut redriven, mut purged, mut refused) = (0, 0, Vec::new());
            for row in &rows {
                let id = row.envelope.id;
                match agentsaga_saga::Engine::moot(store, &row.envelope).await? {
                    Some(_) if force => {
                        store.admin().purge_dead_letter(id).await?;
                        purged += 1;
                    }
                    Some(why) => refused.push((id, why)),
                    None => {
                        store.admin().redrive(id).await?;
                        redriven += 1;
                    }
                }
            }
            let scope = destination.map_or_else(String::new, |d| format!(" to `{d}`"));
            outln!("re-drove {redriven} dead letter(s){scope}: pending again, attempts reset");
            if purged > 0 {
                outln!("purged {purged} moot dead letter(s)");
            }
            for (id, why) in &refused {
                outln!("refused {id}: {why}");
            }
            if !refused.is_empty() {
                outln!(
                    "{} moot dead letter(s) left as they are (`--force` purges them)",
                    refused.len()
                );
            }
        }
    }
    Ok(())
}

pub(super) async fn purge(store: &Store, older_than: Duration) -> anyhow::Result<()> {
    let n = store.admin().purge_dead(older_than).await?;
    outln!(
        "purged {n} dead letter(s) created more than {} ago",
        compact_duration(older_than)
    );
    Ok(())
}
