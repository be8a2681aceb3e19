//! `agentsaga prune` and `agentsaga migrate`.

use std::time::Duration;

use agentsaga_core::{POSTGRES_MIGRATOR, SQLITE_MIGRATOR, Store};

use crate::format::compact_duration;

pub(super) async fn prune(
    store: &Store,
    older_than: Duration,
    sagas_older_than: Option<Duration>,
) -> anyhow::Result<()> {
    let delivered = store.admin().prune_delivered(older_than).await?;
    let inbox = store.admin().prune_inbox(older_than).await?;
    outln!(
        "pruned {delivered} delivered outbox row(s) and {inbox} inbox record(s) older than {}",
        compact_duration(older_than)
    );
    if let Some(age) = sagas_older_than {
        let p = agentsaga_saga::query::prune_finished(store, age).await?;
        outln!(
            "pruned {} finished saga(s) (with their steps) and {} of their dead letter(s), finished more than {} ago",
            p.sagas,
            p.dead_letters,
            compact_duration(age)
        );
    }
    Ok(())
}

/// Opening the store applied the migrations already; report where the schema is.
pub(super) fn migrate(store: &Store) -> anyhow::Result<()> {
    let migrator = match store.backend() {
        "postgres" => &POSTGRES_MIGRATOR,
        _ => &SQLITE_MIGRATOR,
    };
    let version = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    outln!("backend: {}", store.backend());
    outln!("schema up to date (version {version})");
    Ok(())
}
