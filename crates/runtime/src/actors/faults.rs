//! How an agent actor handles a delivery: the agent runs it, unless a test's fault
//! waits for its destination (feature `testing`, `crate::faults`), which answers it as
//! the agent's failure would (or delivers it twice).

use agentsaga_core::Envelope;
use agentsaga_relay::Delivery;

use super::{AgentHandler, DeliveryHandler};
#[cfg(feature = "testing")]
use super::{AgentRunner, Hub};
#[cfg(feature = "testing")]
use crate::faults::Fault;
#[cfg(feature = "testing")]
use tracing::Instrument as _;

#[async_trait::async_trait]
impl DeliveryHandler for AgentHandler {
    async fn handle(&self, env: &Envelope) -> Delivery {
        #[cfg(feature = "testing")]
        if self.hub.faults.is_cut(&env.destination) {
            return Delivery::unavailable(format!("a test cut the link to {}", env.destination));
        }
        #[cfg(feature = "testing")]
        if let Some(fault) = self.hub.faults.take(env) {
            // Traced as the agent's own failure would be: in the message's trace.
            let span = super::agent_span(env);
            return deliver(&self.hub, self.agent.as_ref(), env, fault)
                .instrument(span)
                .await;
        }
        self.agent.run(&self.hub, env).await
    }
}

/// Answers `env` with `fault`, as the agent's failure would be answered (or, for
/// [`Fault::Twice`], delivers it to `agent` twice).
#[cfg(feature = "testing")]
async fn deliver(hub: &Hub, agent: &dyn AgentRunner, env: &Envelope, fault: Fault) -> Delivery {
    tracing::info!(fault = ?fault, "a test's fault answers this delivery");
    let error = match fault {
        Fault::Retryable(e) => crate::agent::StepError::Retryable(e),
        Fault::Fatal(e) => crate::agent::StepError::Fatal(e),
        Fault::TimedOut => return super::finish_timed_out(hub, env).await,
        Fault::DeadLetter(reason) => return Delivery::reject(reason),
        Fault::Twice => {
            let first = agent.run(hub, env).await;
            let again = Envelope {
                attempts: env.attempts.saturating_add(1),
                ..env.clone()
            };
            let second = agent.run(hub, &again).await;
            tracing::info!(first = ?first, second = ?second, "the same message delivered twice");
            return first;
        }
    };
    super::finish_failed(hub, env, error, agentsaga_saga::Usage::default()).await
}
