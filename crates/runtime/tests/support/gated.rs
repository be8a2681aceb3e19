//! A calling agent that waits at a gate the test opens (outside any transaction),
//! records each command under its destination and answers as the test says (the agent
//! of the tests of sagas that wait: signals, plans); a refused signal.

// Not every test binary including this file refuses signals.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use agentsaga_runtime::{
    AgentContext, CallContext, CallingAgent, Runtime, RuntimeBuilder, StepError,
};
use agentsaga_saga::{Error as SagaError, SagaId, Signal};
use serde_json::Value;
use tokio::sync::watch;

/// The commands every agent was given, as (destination, command), in order.
pub(crate) type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// A gated agent's answer: from its context, its destination, the command and the
/// number of commands seen so far (this one included).
pub(crate) type Answer =
    Arc<dyn Fn(&AgentContext<'_>, &str, Value, usize) -> Result<Value, StepError> + Send + Sync>;

/// What a test keeps across restarts of its runtime (a process stopped, another
/// started): the database, the commands its gated agents were given, and their gate
/// (closed until `open` sends `true`).
pub(crate) struct Gates {
    pub(crate) url: String,
    pub(crate) seen: Seen,
    pub(crate) open: watch::Sender<bool>,
}

impl Gates {
    pub(crate) fn new(url: String, open: bool) -> Self {
        Self {
            url,
            seen: Seen::default(),
            open: watch::channel(open).0,
        }
    }

    /// A runtime on the database with a gated agent for each of `destinations`, each
    /// answering `answer`.
    pub(crate) fn agents(&self, destinations: &[&'static str], answer: &Answer) -> RuntimeBuilder {
        let mut b = Runtime::builder().database(&self.url);
        for &destination in destinations {
            b = b.calling_agent(Gated {
                destination,
                seen: Arc::clone(&self.seen),
                gate: self.open.subscribe(),
                answer: Arc::clone(answer),
            });
        }
        b
    }

    /// The commands seen so far, as (destination, command), in order.
    pub(crate) fn seen(&self) -> Vec<(String, Value)> {
        self.seen.lock().unwrap().clone()
    }
}

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

/// A signal `name` to saga `id` is refused (the saga waits for no such signal).
pub(crate) async fn assert_signal_refused(rt: &Runtime, id: SagaId, name: &str) {
    let err = rt
        .signal(id, name, Signal::Approve(Value::Null))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            agentsaga_runtime::Error::Saga(SagaError::SignalRefused { .. })
        ),
        "{err}"
    );
}
