//! `agentsaga starts list | remove`: the waiting starts that could not be started when
//! their turn came (set aside by admission control).

use agentsaga_console::Console;
use agentsaga_saga::SagaId;

use crate::format::print_json;
use crate::format::{Table, truncate};

pub(super) async fn list(console: &Console, json: bool) -> anyhow::Result<()> {
    let starts = console.set_aside_starts().await?;
    if json {
        return print_json(&serde_json::json!({ "set_aside": starts }));
    }
    if starts.is_empty() {
        outln!("no set-aside starts");
        return Ok(());
    }
    let mut table = Table::new(&["ID", "NAME", "ACCEPTED", "SET ASIDE", "ERROR", "DATA"]);
    for s in &starts {
        table.row(vec![
            s.id.clone(),
            s.name.clone(),
            s.created_at.clone(),
            s.set_aside_at.clone(),
            truncate(&s.error, 80),
            truncate(&s.data.to_string(), 40),
        ]);
    }
    out!("{}", table.render());
    Ok(())
}

pub(super) async fn remove(console: &Console, id: SagaId) -> anyhow::Result<()> {
    let removed = console.remove_start(id).await?;
    outln!(
        "removed the set-aside start {} of saga `{}`",
        removed.id,
        removed.name
    );
    Ok(())
}
