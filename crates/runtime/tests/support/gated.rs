//! A calling agent that waits at a gate the test opens (outside any transaction),
//! records each command under its destination and answers as the test says; and the
//! checks of the tests that use it (sagas that wait: signals, plans).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga_runtime::{AgentContext, CallContext, CallingAgent, Runtime, StepError};
use agentsaga_saga::{SagaId, SagaState, query};
use serde_json::Value;
use tokio::sync::watch;

/// The commands every agent was given, as (destination, command), in order.
pub(crate) type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// A gated agent's answer: from its context, its destination, the command and the
/// number of commands seen so far (this one included).
pub(crate) type Answer =
    Arc<dyn Fn(&AgentContext<'_>, &str, Value, usize) -> Result<Value, StepError> + Send + Sync>;

/// Waits at `gate`, records the command in `seen`, answers with `answer`. The wait is
/// the agent's outside call (no transaction held): a gate inside a database-only
/// handler would hold SQLite's single writer and block the test's own `signal` behind
/// it.
pub(crate) struct Gated {
    pub(crate) destination: &'static str,
    pub(crate) seen: Seen,
    pub(crate) gate: watch::Receiver<bool>,
    pub(crate) answer: Answer,
}

#[async_trait::async_trait]
impl CallingAgent for Gated {
    type Command = Value;
    type Output = ();
    type Reply = Value;
    fn destination(&self) -> &str {
        self.destination
    }
    async fn call(&self, _: &CallContext<'_>, _: &Value) -> Result<(), StepError> {
        let _ = self.gate.clone().wait_for(|open| *open).await;
        Ok(())
    }
    async fn record(
        &self,
        ctx: &mut AgentContext<'_>,
        cmd: Value,
        (): (),
    ) -> Result<Value, StepError> {
        let n = {
            let mut seen = self.seen.lock().unwrap();
            seen.push((self.destination.to_owned(), cmd.clone()));
            seen.len()
        };
        (self.answer)(ctx, self.destination, cmd, n)
    }
}

/// Waits (30 s at most) until saga `id` settles; its state.
pub(crate) async fn settle(rt: &Runtime, id: SagaId) -> SagaState {
    tokio::time::timeout(Duration::from_secs(30), rt.wait(id))
        .await
        .expect("the saga settles")
        .unwrap()
}

/// Saga `id`'s error contains `needle`.
pub(crate) async fn assert_error_contains(rt: &Runtime, id: SagaId, needle: &str) {
    let saga = query::get(rt.store(), id).await.unwrap().unwrap();
    assert!(
        saga.error.as_deref().unwrap_or_default().contains(needle),
        "{saga:?}"
    );
}
