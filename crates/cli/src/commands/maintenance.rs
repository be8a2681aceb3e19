//! `agentsaga prune` and `agentsaga migrate`.

use std::time::Duration;

use agentsaga_core::Store;
use agentsaga_relay::RelayConfig;

use crate::format::compact_duration;

pub(super) async fn prune(
    store: &Store,
    older_than: Duration,
    sagas_older_than: Option<Duration>,
) -> anyhow::Result<()> {
    let delivered = store.admin().prune_delivered(older_than).await?;
    // Inbox records inside the redelivery window are kept, whatever `--older-than`
    // says: a late duplicate would be processed again. (The store also keeps the
    // record of any message whose outbox row may still be delivered, however old.)
    let window = RelayConfig::default().redelivery_window();
    let inbox_age = older_than.max(window);
    let inbox = store.admin().prune_inbox(inbox_age).await?;
    if inbox_age > older_than {
        outln!(
            "pruned {delivered} delivered outbox row(s) older than {} and {inbox} inbox \
             record(s) older than {} (inbox records are kept for the redelivery window: a \
             lease per attempt plus the retry backoff)",
            compact_duration(older_than),
            compact_duration(inbox_age)
        );
    } else {
        outln!(
            "pruned {delivered} delivered outbox row(s) and {inbox} inbox record(s) older \
             than {}",
            compact_duration(older_than)
        );
    }
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

/// Opening the store applied the migrations missing from `before` (the versions
/// applied when `migrate` began): say which, and where the schema is now.
pub(super) fn migrate(store: &Store, before: &[i64]) -> anyhow::Result<()> {
    let migrator = store.migrator();
    let version = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    let applied: Vec<String> = migrator
        .iter()
        .filter(|m| !before.contains(&m.version))
        .map(|m| format!("{} {}", m.version, m.description))
        .collect();
    outln!("backend: {}", store.backend());
    if applied.is_empty() {
        outln!("nothing to apply");
    } else {
        outln!("applied: {}", applied.join(", "));
    }
    outln!("schema up to date (version {version})");
    Ok(())
}
