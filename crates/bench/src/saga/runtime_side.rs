//! The runtime side of the `saga` bench: the sagas run by [`agentsaga_runtime::Runtime`],
//! with no-op agents.

use agentsaga_relay::RelayConfig;
use agentsaga_runtime::Runtime;
use agentsaga_saga::{SagaDefinition, SagaState};
use anyhow::bail;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::drive::{Run, check_and_measure, drive};
use super::setup::{SAGA, STEPS, Scenario};
use crate::db::Backend;
use crate::quick::QuickAgent;

/// The saga data.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Data {
    pub(super) n: u64,
    pub(super) fail: bool,
}

/// An agent that answers at once; `agent_c` fails fatally when the command says `fail`.
pub(super) fn agent(destination: &'static str) -> QuickAgent {
    QuickAgent {
        destination,
        answers: ("done", "done"),
        refuses: |destination, command| {
            destination == STEPS[2].1 && command.get("fail").and_then(Value::as_bool) == Some(true)
        },
    }
}

pub(super) fn definition() -> anyhow::Result<SagaDefinition> {
    crate::quick::two_then_pivot(SAGA, STEPS, |d: &Data| d.n)
}

/// The store's settings for the runtime side: the bench's `--sqlite-synchronous`.
pub(super) fn store_config() -> agentsaga_core::StoreConfig {
    let config = agentsaga_core::StoreConfig::default();
    if crate::db::sqlite_full_sync() {
        config.synchronous(agentsaga_core::Synchronous::Full)
    } else {
        config
    }
}

/// A run of the runtime with its agents in the same process.
pub(super) async fn runtime_run(
    backend: Backend,
    url: &str,
    scenario: Scenario,
    n: usize,
    workers: usize,
) -> anyhow::Result<Run> {
    let mut builder = Runtime::builder()
        .database(url)
        .store_config(store_config())
        .answers_in_agent_transaction(!crate::db::answers_via_outbox())
        .saga(definition()?)
        .relay_config(RelayConfig::default().workers(workers));
    for (_, destination) in STEPS {
        builder = builder.agent(agent(destination));
    }
    measure(backend, url, scenario, n, builder.start().await?).await
}

/// Drives `n` sagas of `scenario` through `runtime` (on `url`), shuts it down, checks
/// their final states and measures.
pub(super) async fn measure(
    backend: Backend,
    url: &str,
    scenario: Scenario,
    n: usize,
    runtime: Runtime,
) -> anyhow::Result<Run> {
    let store = runtime.store().clone();
    let driven = drive(
        n,
        |first, count| {
            let runtime = &runtime;
            async move {
                let data: Vec<Data> = (first..first + count)
                    .map(|i| {
                        let n = i as u64;
                        Data {
                            n,
                            fail: scenario.fails(n),
                        }
                    })
                    .collect();
                let mut tx = runtime.store().begin().await?;
                runtime.start_sagas_in(&mut tx, SAGA, &data).await?;
                tx.commit().await?;
                Ok(())
            }
        },
        |started| {
            let store = store.clone();
            async move {
                let mut done = 0u64;
                for (state, count) in agentsaga_saga::query::count_by_state(&store).await? {
                    match state {
                        SagaState::Completed | SagaState::Compensated => done += count,
                        SagaState::Running | SagaState::Compensating => {}
                        other => bail!("{count} sagas are {other}"),
                    }
                }
                Ok(started.saturating_sub(done as usize))
            }
        },
    )
    .await;
    let hops = runtime.store().hop_stats();
    let relay = runtime.relay_stats().unwrap_or_default();
    runtime.shutdown().await;
    let driven = driven?;
    let latencies = check_and_measure(backend, url, scenario, n).await?;
    let delivered = relay.delivered + relay.retried + relay.dead + relay.released;
    Ok(Run {
        rate: driven.rate(n),
        latencies,
        cpu_per_saga: driven.cpu_per_saga(n),
        hops_per_commit: (hops.commits > 0).then(|| hops.hops as f64 / hops.commits as f64),
        handed_share: (delivered > 0).then(|| relay.handed_over as f64 / delivered as f64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::saga::setup::ORCHESTRATOR;

    #[test]
    fn the_definition_builds() {
        let d = definition().unwrap();
        assert_eq!(d.orchestrator_destination(), ORCHESTRATOR);
        assert_eq!(
            d.agent_destinations(),
            vec!["agent_a", "agent_b", "agent_c"]
        );
    }
}
