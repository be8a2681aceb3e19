//! `agentsaga sagas list` and `agentsaga sagas show`.

use agentsaga_core::Store;
use agentsaga_saga::query::{self, ListFilter, SagaSummary, StepView};
use agentsaga_saga::{Engine, SagaId, SagaState, Signal, SignalReceipt};
use serde::Serialize;

use super::{json_value, print_json};
use crate::format::{Table, or_dash, rfc3339, truncate, ts_or_dash};

/// One saga in `sagas list --json` and `sagas show --json`.
#[derive(Debug, Serialize)]
struct SagaDoc {
    id: String,
    name: String,
    version: i32,
    state: &'static str,
    error: Option<String>,
    key: Option<String>,
    waiting_for: Option<String>,
    created_at: String,
    created_at_ms: i64,
    updated_at: String,
    updated_at_ms: i64,
}

impl From<&SagaSummary> for SagaDoc {
    fn from(s: &SagaSummary) -> Self {
        Self {
            id: s.id.to_string(),
            name: s.name.clone(),
            version: s.version,
            state: s.state.as_str(),
            error: s.error.clone(),
            key: s.key.clone(),
            waiting_for: s.waiting_for.clone(),
            created_at: rfc3339(s.created_at_ms),
            created_at_ms: s.created_at_ms,
            updated_at: rfc3339(s.updated_at_ms),
            updated_at_ms: s.updated_at_ms,
        }
    }
}

/// One step of `sagas show --json`, with its compensation-ledger entry.
#[derive(Debug, Serialize)]
struct StepDoc {
    idx: i64,
    stage: i64,
    name: String,
    destination: String,
    state: String,
    attempts: i64,
    error: Option<String>,
    dispatched_at: Option<String>,
    dispatched_at_ms: Option<i64>,
    replied_at: Option<String>,
    replied_at_ms: Option<i64>,
    compensation_destination: Option<String>,
    compensation_payload: Option<serde_json::Value>,
    compensation_state: Option<String>,
    compensation_attempts: i64,
    compensation_error: Option<String>,
    compensated_at: Option<String>,
    compensated_at_ms: Option<i64>,
}

impl From<&StepView> for StepDoc {
    fn from(s: &StepView) -> Self {
        Self {
            idx: s.idx,
            stage: s.stage,
            name: s.name.clone(),
            destination: s.destination.clone(),
            state: s.state.to_string(),
            attempts: s.attempts,
            error: s.error.clone(),
            dispatched_at: s.dispatched_at_ms.map(rfc3339),
            dispatched_at_ms: s.dispatched_at_ms,
            replied_at: s.replied_at_ms.map(rfc3339),
            replied_at_ms: s.replied_at_ms,
            compensation_destination: s.compensation_destination.clone(),
            compensation_payload: s.compensation_payload.as_deref().map(json_value),
            compensation_state: s.compensation_state.map(|c| c.to_string()),
            compensation_attempts: s.compensation_attempts,
            compensation_error: s.compensation_error.clone(),
            compensated_at: s.compensated_at_ms.map(rfc3339),
            compensated_at_ms: s.compensated_at_ms,
        }
    }
}

#[derive(Debug, Serialize)]
struct ListDoc {
    sagas: Vec<SagaDoc>,
}

#[derive(Debug, Serialize)]
struct ShowDoc {
    saga: SagaDoc,
    /// The saga's data as it now stands (a planned saga's: input, plan, results).
    data: serde_json::Value,
    steps: Vec<StepDoc>,
}

pub(super) async fn list(
    store: &Store,
    state: Option<SagaState>,
    name: Option<String>,
    key: Option<String>,
    waiting: bool,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    let filter = ListFilter {
        state,
        name,
        key,
        waiting,
        limit,
    };
    let sagas = query::list(store, &filter).await?;
    if json {
        return print_json(&ListDoc {
            sagas: sagas.iter().map(SagaDoc::from).collect(),
        });
    }
    if sagas.is_empty() {
        outln!("no sagas");
        return Ok(());
    }
    let mut table = Table::new(&[
        "ID", "NAME", "VERSION", "STATE", "WAITING", "KEY", "CREATED", "UPDATED", "ERROR",
    ])
    .right(&[2]);
    for s in &sagas {
        table.row(vec![
            s.id.to_string(),
            s.name.clone(),
            s.version.to_string(),
            s.state.to_string(),
            or_dash(s.waiting_for.as_deref()),
            truncate(&or_dash(s.key.as_deref()), 40),
            rfc3339(s.created_at_ms),
            rfc3339(s.updated_at_ms),
            truncate(&or_dash(s.error.as_deref()), 60),
        ]);
    }
    out!("{}", table.render());
    Ok(())
}

pub(super) async fn show(store: &Store, id: SagaId, json: bool) -> anyhow::Result<()> {
    let Some(saga) = query::get(store, id).await? else {
        anyhow::bail!("no saga with id {id}");
    };
    let steps = query::steps(store, id).await?;
    let data = query::data(store, id).await?.unwrap_or_default();
    if json {
        return print_json(&ShowDoc {
            saga: SagaDoc::from(&saga),
            data,
            steps: steps.iter().map(StepDoc::from).collect(),
        });
    }
    outln!("saga     {}", saga.id);
    outln!("name     {} (version {})", saga.name, saga.version);
    outln!("state    {}", saga.state);
    outln!("key      {}", or_dash(saga.key.as_deref()));
    if let Some(signal) = &saga.waiting_for {
        outln!("waiting  for signal `{signal}`");
    }
    outln!("error    {}", or_dash(saga.error.as_deref()));
    outln!("created  {}", rfc3339(saga.created_at_ms));
    outln!("updated  {}", rfc3339(saga.updated_at_ms));
    outln!("data     {data}");
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
        "ERROR",
    ])
    .right(&[0, 1, 5]);
    for s in &steps {
        timeline.row(vec![
            s.idx.to_string(),
            s.stage.to_string(),
            s.name.clone(),
            s.destination.clone(),
            s.state.to_string(),
            s.attempts.to_string(),
            ts_or_dash(s.dispatched_at_ms),
            ts_or_dash(s.replied_at_ms),
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
            s.compensation_state
                .map_or_else(|| "-".to_owned(), |c| c.to_string()),
            s.compensation_attempts.to_string(),
            ts_or_dash(s.compensated_at_ms),
            or_dash(s.compensation_error.as_deref()),
            or_dash(s.compensation_payload.as_deref()),
        ]);
    }
    if ledger.is_empty() {
        outln!("(no compensations recorded)");
    } else {
        out!("{}", ledger.render());
    }
    if saga.state == SagaState::Stuck {
        outln!();
        if steps
            .iter()
            .any(|s| s.compensation_state == Some(agentsaga_saga::CompensationState::Failed))
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
    Ok(())
}

/// `sagas signal ID NAME [--data JSON | --reject REASON]`.
pub(super) async fn signal(
    store: &Store,
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
    let mut tx = store.begin().await?;
    let receipt = Engine::signal(&mut tx, id, name, signal).await?;
    tx.commit().await?;
    match receipt {
        SignalReceipt::Recorded => outln!("signal `{name}` sent to saga {id}"),
        SignalReceipt::Duplicate => {
            outln!("saga {id} already had its signal `{name}`: nothing changed");
        }
    }
    Ok(())
}
