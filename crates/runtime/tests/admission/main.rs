//! Admission control, on both backends: a burst beyond a saga name's bound waits in
//! order and loses nothing; `try_start_saga` answers busy; `start_saga` waits its turn.

mod bound;
mod set_aside;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_core::{StoreConfig, both_backends};
use agentsaga_runtime::{AgentContext, CallContext, CallingAgent, Runtime, StepError};
use agentsaga_saga::{Engine, Saga, SagaId, SagaState, Step};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

#[derive(Serialize, Deserialize)]
struct Job {
    n: u32,
}

/// Waits at a gate; records the order of the jobs it was given and its peak
/// concurrency (one step per saga: the sagas in flight).
struct Gated {
    gate: watch::Receiver<bool>,
    in_flight: Arc<AtomicU32>,
    peak: Arc<AtomicU32>,
    order: Arc<Mutex<Vec<u32>>>,
}

#[async_trait::async_trait]
impl CallingAgent for Gated {
    type Command = Job;
    type Output = u32;
    type Reply = u32;
    fn destination(&self) -> &str {
        "gated"
    }
    async fn call(&self, _: &CallContext<'_>, job: &Job) -> Result<u32, StepError> {
        self.order.lock().unwrap().push(job.n);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        let mut gate = self.gate.clone();
        let _ = gate.wait_for(|open| *open).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(job.n)
    }
    async fn record(&self, _: &mut AgentContext<'_>, _: Job, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

async fn until(what: &str, cond: impl AsyncFnMut() -> bool) {
    agentsaga_core::testing::wait_until(what, Duration::from_secs(60), cond).await;
}

async fn waiting(rt: &Runtime) -> u64 {
    Engine::waiting_starts(rt.store())
        .await
        .unwrap()
        .iter()
        .map(|(_, n)| n)
        .sum()
}

/// A runtime whose saga `job` has one gated step and at most `bound` sagas in flight.
struct GatedRuntime {
    rt: Runtime,
    open: watch::Sender<bool>,
    in_flight: Arc<AtomicU32>,
    peak: Arc<AtomicU32>,
    order: Arc<Mutex<Vec<u32>>>,
}

async fn gated_runtime(backend: Backend, bound: usize) -> GatedRuntime {
    gated_runtime_at(fresh_url(backend).await, bound, StoreConfig::default()).await
}

/// [`gated_runtime`] on the database at `url`, with `config`.
async fn gated_runtime_at(url: String, bound: usize, config: StoreConfig) -> GatedRuntime {
    let (open, gate) = watch::channel(false);
    let in_flight = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let saga = Saga::<Job>::builder("job", 1)
        .step(
            Step::new("work", "gated")
                .command(|j: &Job| Job { n: j.n })
                .nothing_to_undo(),
        )
        .build()
        .unwrap();
    let rt = Runtime::builder()
        .database(url)
        .store_config(config)
        .calling_agent(Gated {
            gate,
            in_flight: Arc::clone(&in_flight),
            peak: Arc::clone(&peak),
            order: Arc::clone(&order),
        })
        .saga(saga)
        .saga(
            // Its command is its data, whatever its size.
            Saga::<serde_json::Value>::builder("copy", 1)
                .step(
                    Step::new("work", "gated")
                        .command(|v: &serde_json::Value| v.clone())
                        .nothing_to_undo(),
                )
                .build()
                .unwrap(),
        )
        .max_sagas_in_flight(Some(bound))
        .start()
        .await
        .unwrap();
    GatedRuntime {
        rt,
        open,
        in_flight,
        peak,
        order,
    }
}

/// Waits for every saga of `ids` to complete.
async fn all_complete(rt: &Runtime, ids: &[SagaId]) {
    for id in ids {
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(60), rt.wait(*id))
                .await
                .unwrap()
                .unwrap(),
            SagaState::Completed
        );
    }
}
