//! The actors: agent actors run an [`Agent`]'s handler, orchestrator actors run the
//! saga engine. Both take [`Deliver`] messages from the relay's in-process transport
//! and answer only once their transaction has committed.

use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::{Envelope, Receipt, Store};
use agentsaga_relay::Delivery;
use agentsaga_relay::in_process::Deliver;
use agentsaga_saga::{Engine, Handled, SagaState, StepOutcome, outcome};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::broadcast;
use tracing::Instrument;

use crate::agent::{Agent, AgentContext, StepError};

/// An agent with its types erased, as its actors run it.
#[async_trait::async_trait]
pub(crate) trait Process: Send + Sync + 'static {
    fn destination(&self) -> &str;
    async fn process(&self, store: &Store, env: &Envelope) -> Delivery;
}

pub(crate) struct Erased<A>(pub(crate) A);

fn infra(e: impl std::fmt::Display) -> Delivery {
    Delivery::retry(format!("database: {e}"))
}

#[async_trait::async_trait]
impl<A: Agent> Process for Erased<A> {
    fn destination(&self) -> &str {
        self.0.destination()
    }

    async fn process(&self, store: &Store, env: &Envelope) -> Delivery {
        let span = tracing::info_span!(
            "agent.handle",
            otel.kind = "consumer",
            agent = %env.destination,
            message.id = %env.id,
            saga.id = env.header(agentsaga_core::header::SAGA_ID).unwrap_or_default(),
            step.name = env.header(outcome::STEP_NAME).unwrap_or_default(),
            compensation = env.header(agentsaga_core::header::KIND) == Some(outcome::KIND_COMPENSATE),
        );
        agentsaga_core::propagation::adopt(&span, &env.headers);
        self.process_in_span(store, env).instrument(span).await
    }
}

impl<A: Agent> Erased<A> {
    async fn process_in_span(&self, store: &Store, env: &Envelope) -> Delivery {
        let command: A::Command = match env.decode() {
            Ok(c) => c,
            Err(e) => {
                return Delivery::reject(format!(
                    "payload does not decode into {}: {e}",
                    std::any::type_name::<A::Command>()
                ));
            }
        };
        let mut tx = match store.begin().await {
            Ok(tx) => tx,
            Err(e) => return infra(e),
        };
        match tx.receive(&env.destination, env.id).await {
            Ok(Receipt::First) => {}
            Ok(Receipt::Duplicate) => {
                tracing::debug!("duplicate delivery skipped");
                return Delivery::Delivered;
            }
            Err(e) => return infra(e),
        }
        let result = {
            let mut ctx = AgentContext {
                tx: &mut tx,
                envelope: env,
            };
            self.0.handle(&mut ctx, command).await
        };
        let out = match result {
            Ok(reply) => match serde_json::to_value(reply) {
                Ok(v) => StepOutcome::Ok(v),
                Err(e) => StepOutcome::Fatal(format!("the reply does not serialize: {e}")),
            },
            Err(StepError::Infrastructure(e)) => return Delivery::retry(e),
            Err(e) => {
                // The handler's effects roll back; only the inbox record and the
                // failure reply are written.
                if let Err(e) = tx.rollback().await {
                    return infra(e);
                }
                tx = match store.begin().await {
                    Ok(tx) => tx,
                    Err(e) => return infra(e),
                };
                match tx.receive(&env.destination, env.id).await {
                    Ok(Receipt::First) => {}
                    Ok(Receipt::Duplicate) => return Delivery::Delivered,
                    Err(e) => return infra(e),
                }
                match e {
                    StepError::Retryable(e) => StepOutcome::Retryable(e),
                    other => StepOutcome::Fatal(
                        other.to_string().trim_start_matches("fatal: ").to_owned(),
                    ),
                }
            }
        };
        if let Some(e) = out.error() {
            tracing::info!(error = %e, "step failed");
        }
        match outcome::reply(env, &out) {
            Ok(Some(reply)) => {
                if let Err(e) = tx.enqueue(&reply).await {
                    return infra(e);
                }
            }
            Ok(None) => {}
            Err(e) => return Delivery::reject(e.to_string()),
        }
        match tx.commit().await {
            Ok(()) => Delivery::Delivered,
            Err(e) => infra(e),
        }
    }
}

/// Something that turns one delivered envelope into an outcome: an agent with its
/// store, or the orchestrator.
#[async_trait::async_trait]
pub(crate) trait Handle: Send + Sync + 'static {
    async fn handle(&self, env: &Envelope) -> Delivery;
}

/// An actor that answers each [`Deliver`] with its handler's outcome, one at a time
/// (spawn several for concurrency). A panic in the handler kills the actor; the
/// supervisor replaces it and the relay delivers the message again.
pub(crate) struct DeliveryActor<H>(pub(crate) H);

impl<H: Handle> Actor for DeliveryActor<H> {
    type Msg = Deliver;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<Deliver>, (): ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<Deliver>,
        msg: Deliver,
        (): &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let delivery = self.0.handle(&msg.envelope).await;
        let _ = msg.reply.send(delivery);
        Ok(())
    }
}

/// An agent and the store its transactions run on.
pub(crate) struct AgentHandler {
    pub(crate) agent: Arc<dyn Process>,
    pub(crate) store: Store,
}

#[async_trait::async_trait]
impl Handle for AgentHandler {
    async fn handle(&self, env: &Envelope) -> Delivery {
        self.agent.process(&self.store, env).await
    }
}

/// A saga reached a terminal (or stuck) state: `Runtime::wait` listens for these.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settled {
    pub(crate) saga: agentsaga_saga::SagaId,
    pub(crate) state: SagaState,
}

/// Advances sagas with the engine, one message (one transaction) at a time.
pub(crate) struct Orchestrator {
    pub(crate) engine: Engine,
    pub(crate) store: Store,
    pub(crate) settled: broadcast::Sender<Settled>,
}

impl Orchestrator {
    async fn process(&self, env: &Envelope) -> Delivery {
        let span = tracing::info_span!(
            "saga.step",
            otel.kind = "consumer",
            saga.id = env.header(agentsaga_core::header::SAGA_ID).unwrap_or_default(),
            saga.name = %env.destination,
            step.name = env.header(outcome::STEP_NAME).unwrap_or_default(),
            message.kind = env.header(agentsaga_core::header::KIND).unwrap_or_default(),
            message.id = %env.id,
        );
        agentsaga_core::propagation::adopt(&span, &env.headers);
        self.process_in_span(env).instrument(span).await
    }

    async fn process_in_span(&self, env: &Envelope) -> Delivery {
        let mut tx = match self.store.begin().await {
            Ok(tx) => tx,
            Err(e) => return infra(e),
        };
        match self.engine.handle(&mut tx, env).await {
            Ok(handled) => {
                if let Err(e) = tx.commit().await {
                    return infra(e);
                }
                if let Handled::Advanced { saga, state } = handled
                    && (state.is_terminal() || state == SagaState::Stuck)
                {
                    tracing::info!(%state, "saga settled");
                    crate::metrics::saga_finished(&self.store, saga).await;
                    let _ = self.settled.send(Settled { saga, state });
                }
                Delivery::Delivered
            }
            Err(agentsaga_saga::Error::VersionNotRegistered { name, version }) => {
                // Leave it for a process that has this version; check back later.
                tracing::warn!(%name, version, "saga version not registered here");
                Delivery::retry_after(
                    format!("saga {name} v{version} not registered"),
                    Duration::from_secs(30),
                )
            }
            Err(agentsaga_saga::Error::Store(e)) => infra(e),
            Err(e) => Delivery::reject(e.to_string()),
        }
    }
}

#[async_trait::async_trait]
impl Handle for Orchestrator {
    async fn handle(&self, env: &Envelope) -> Delivery {
        self.process(env).await
    }
}
