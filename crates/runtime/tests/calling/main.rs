//! Agents that wait on the outside world (`CallingAgent`), on both backends: their
//! waits hold no database, run hundreds at once, outlive leases, are cancelled past
//! their step's timeout, and see one idempotency key per step.
//!
//! Waits are gates the test opens, not sleeps it hopes are long enough: "while one
//! call waits, 100 sagas complete" holds however slow the machine is.

mod rate_limits;
mod redelivery;
mod usage;
mod waits;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "../support/echo.rs"]
mod echo;

use agentsaga_core::testing::{Backend, backends, fresh_url};
use agentsaga_core::{MessageId, RetryPolicy, both_backends};
use agentsaga_relay::RelayConfig;
use agentsaga_runtime::{
    Agent, AgentContext, CallContext, CallingAgent, Runtime, RuntimeBuilder, StepError,
};
use agentsaga_saga::{Saga, SagaDefinition, SagaId, SagaState, Step, Undoable, query};
use echo::Echo;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;

/// What a calling agent saw: calls in flight and their peak, each call's key.
#[derive(Default)]
struct Calls {
    in_flight: AtomicU32,
    peak: AtomicU32,
    started: AtomicU32,
    finished: AtomicU32,
    cancelled: AtomicU32,
    /// (idempotency key, message id, compensation?) of each call, in start order.
    seen: Mutex<Vec<(String, MessageId, bool)>>,
}

impl Calls {
    fn seen(&self) -> Vec<(String, MessageId, bool)> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits (bounded) until `n` calls are in flight.
    async fn until_in_flight(&self, what: &str, n: u32) {
        until(what, || self.in_flight.load(Ordering::SeqCst) == n).await;
    }
}

/// Counts a call in flight; on drop, counts it finished or (if dropped before
/// `done`) cancelled.
struct InFlight<'a> {
    calls: &'a Calls,
    done: bool,
}

impl<'a> InFlight<'a> {
    fn enter(calls: &'a Calls, ctx: &CallContext<'_>) -> Self {
        calls.seen.lock().unwrap().push((
            ctx.idempotency_key(),
            ctx.message_id(),
            ctx.is_compensation(),
        ));
        calls.started.fetch_add(1, Ordering::SeqCst);
        let now = calls.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        calls.peak.fetch_max(now, Ordering::SeqCst);
        Self { calls, done: false }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.calls.in_flight.fetch_sub(1, Ordering::SeqCst);
        if self.done {
            self.calls.finished.fetch_add(1, Ordering::SeqCst);
        } else {
            self.calls.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// What a call does, chosen per call (in start order) by the test.
#[derive(Clone, Copy, Debug)]
enum Act {
    /// Waits until the gate opens.
    Gate,
    /// Sleeps this long.
    Sleep(Duration),
    /// Fails as infrastructure: the relay delivers the same message again.
    Infra,
    /// Answers at once.
    Answer,
}

/// A calling agent whose calls do what `script` says (the last entry repeats).
struct Outside {
    destination: &'static str,
    calls: Arc<Calls>,
    gate: watch::Receiver<bool>,
    script: Vec<Act>,
}

impl Outside {
    fn new(destination: &'static str, script: Vec<Act>) -> (Self, Arc<Calls>, watch::Sender<bool>) {
        let calls = Arc::new(Calls::default());
        let (open, gate) = watch::channel(false);
        let agent = Self {
            destination,
            calls: Arc::clone(&calls),
            gate,
            script,
        };
        (agent, calls, open)
    }
}

#[async_trait::async_trait]
impl CallingAgent for Outside {
    type Command = Value;
    type Output = String;
    type Reply = String;

    fn destination(&self) -> &str {
        self.destination
    }

    async fn call(&self, ctx: &CallContext<'_>, _: &Value) -> Result<String, StepError> {
        let n = self.calls.started.load(Ordering::SeqCst) as usize;
        let act = self.script[n.min(self.script.len() - 1)];
        let mut guard = InFlight::enter(&self.calls, ctx);
        match act {
            Act::Gate => {
                let mut gate = self.gate.clone();
                let _ = gate.wait_for(|open| *open).await;
            }
            Act::Sleep(d) => tokio::time::sleep(d).await,
            Act::Infra => {
                guard.done = true;
                return Err(StepError::Infrastructure("the API is unreachable".into()));
            }
            Act::Answer => {}
        }
        guard.done = true;
        Ok(ctx.idempotency_key())
    }

    async fn record(
        &self,
        _ctx: &mut AgentContext<'_>,
        _: Value,
        answer: String,
    ) -> Result<String, StepError> {
        Ok(answer)
    }
}

#[derive(Serialize, Deserialize)]
struct Job {
    n: u32,
}

fn quick_retry() -> RetryPolicy {
    RetryPolicy::new(Duration::from_millis(10), Duration::from_millis(50), 5)
}

async fn builder(backend: Backend) -> RuntimeBuilder {
    Runtime::builder()
        .database(fresh_url(backend).await)
        .relay_config(RelayConfig::default().retry(quick_retry()))
}

/// [`builder`] with leases of `lease`.
async fn builder_with_lease(backend: Backend, lease: Duration) -> RuntimeBuilder {
    builder(backend)
        .await
        .relay_config(RelayConfig::default().retry(quick_retry()).lease(lease))
}

/// The saga `name` of the one (compensable or forward-only) step `step`.
fn one_step(name: &str, step: Step<Job, Undoable>) -> SagaDefinition {
    Saga::<Job>::builder(name, 1).step(step).build().unwrap()
}

/// The saga `name` of the one pivot `step`.
fn one_pivot(name: &str, step: Step<Job>) -> SagaDefinition {
    Saga::<Job>::builder(name, 1).pivot(step).build().unwrap()
}

/// `builder` started with the calling agent `agent` and the saga `saga`.
async fn start_calling(
    builder: impl Future<Output = RuntimeBuilder>,
    agent: Outside,
    saga: SagaDefinition,
) -> Runtime {
    builder
        .await
        .calling_agent(agent)
        .saga(saga)
        .start()
        .await
        .unwrap()
}

async fn settle(rt: &Runtime, id: SagaId) -> SagaState {
    tokio::time::timeout(Duration::from_secs(60), rt.wait(id))
        .await
        .expect("the saga settles within a minute")
        .unwrap()
}

/// Waits (bounded) until `cond` holds.
async fn until(what: &str, cond: impl Fn() -> bool) {
    agentsaga_core::testing::wait_until(what, Duration::from_secs(60), async || cond()).await;
}
