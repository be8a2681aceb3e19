//! `agentsaga status`.

use std::collections::BTreeMap;

use agentsaga_core::Store;
use agentsaga_saga::{SagaState, query};
use serde::Serialize;

use super::print_json;
use crate::format::{Table, human_duration};

/// Every saga state, in lifecycle order: the keys of `sagas` in the JSON document.
pub(super) const SAGA_STATES: [SagaState; 6] = [
    SagaState::Running,
    SagaState::Compensating,
    SagaState::Stuck,
    SagaState::Completed,
    SagaState::Compensated,
    SagaState::Aborted,
];

/// The `status --json` document.
#[derive(Debug, Serialize)]
struct StatusDoc {
    backend: &'static str,
    outbox: OutboxDoc,
    dead_letters: u64,
    sagas: BTreeMap<&'static str, u64>,
    sagas_total: u64,
    /// Starts accepted beyond their saga name's admission bound, not yet started
    /// (`saga_starts`), per saga name.
    starts_waiting: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
struct OutboxDoc {
    pending: u64,
    in_flight: u64,
    delivered: u64,
    dead: u64,
    oldest_pending_age_ms: Option<u64>,
}

pub(super) async fn run(store: &Store, json: bool) -> anyhow::Result<()> {
    let stats = store.admin().stats().await?;
    let counts = query::count_by_state(store).await?;
    let starts_waiting: BTreeMap<String, u64> = agentsaga_saga::Engine::waiting_starts(store)
        .await?
        .into_iter()
        .collect();
    let mut sagas: BTreeMap<&'static str, u64> =
        SAGA_STATES.iter().map(|s| (s.as_str(), 0)).collect();
    for (state, n) in &counts {
        *sagas.entry(state.as_str()).or_default() += n;
    }
    let doc = StatusDoc {
        backend: store.backend(),
        dead_letters: stats.dead,
        sagas_total: sagas.values().sum(),
        sagas,
        starts_waiting,
        outbox: OutboxDoc {
            pending: stats.pending,
            in_flight: stats.in_flight,
            delivered: stats.delivered,
            dead: stats.dead,
            oldest_pending_age_ms: stats.oldest_pending_age_ms,
        },
    };
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
    if doc.sagas.get("stuck").copied().unwrap_or_default() > 0 {
        outln!();
        outln!("stuck sagas need an operator: `agentsaga sagas list --state stuck`");
    }
    Ok(())
}
