//! The supervisor: spawns the agent and orchestrator actors (one per destination)
//! linked to itself and, when one dies, spawns a replacement and registers it with the
//! transport. A panic in a handler does not kill its actor (each delivery runs in a
//! task of its own, and a panicking one drops its answer: a retry). The messages a
//! dead actor held were never acknowledged: the relay delivers them again, and the
//! inbox deduplicates them.

use std::collections::HashMap;
use std::sync::Arc;

use agentsaga_core::Store;
use agentsaga_relay::in_process::{Deliver, InProcessTransport};
use agentsaga_saga::Engine;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::broadcast;

use crate::actors::{AgentHandler, AgentRunner, DeliveryActor, Hub, Orchestrator, Settled};

/// What to spawn for one slot; cloned to respawn it.
#[derive(Clone)]
pub(crate) enum ChildSpec {
    Agent {
        agent: Arc<dyn AgentRunner>,
        store: Store,
        concurrency: usize,
        /// Its destination's rate limit, if any.
        limit: Option<crate::RateLimit>,
        /// This process's sagas, to apply the agent's answers to (`None`: through
        /// the outbox).
        sagas: Option<Arc<Orchestrator>>,
        /// A test's faults, shared by the runtime's agents.
        faults: Arc<crate::faults::Faults>,
    },
    Orchestrator {
        destination: String,
        concurrency: usize,
        engine: Engine,
        store: Store,
        settled: broadcast::Sender<Settled>,
    },
}

impl ChildSpec {
    fn destination(&self) -> String {
        match self {
            ChildSpec::Agent { agent, .. } => agent.destination().to_owned(),
            ChildSpec::Orchestrator { destination, .. } => destination.clone(),
        }
    }

    async fn spawn(
        &self,
        supervisor: &ActorRef<SupervisorMsg>,
    ) -> Result<ActorRef<Deliver>, ActorProcessingErr> {
        let cell = supervisor.get_cell();
        Ok(match self.clone() {
            ChildSpec::Agent {
                agent,
                store,
                concurrency,
                limit,
                sagas,
                faults,
            } => {
                let actor = DeliveryActor {
                    handler: Arc::new(AgentHandler {
                        agent,
                        hub: Hub {
                            store,
                            limit,
                            sagas,
                            faults,
                        },
                    }),
                    concurrency,
                };
                Actor::spawn_linked(None, actor, (), cell).await?.0
            }
            ChildSpec::Orchestrator {
                engine,
                store,
                settled,
                concurrency,
                ..
            } => {
                let actor = DeliveryActor {
                    handler: Arc::new(Orchestrator {
                        engine,
                        store,
                        settled,
                    }),
                    concurrency,
                };
                Actor::spawn_linked(None, actor, (), cell).await?.0
            }
        })
    }
}

/// The supervisor's messages.
pub(crate) enum SupervisorMsg {
    /// Stop supervising (children are about to be stopped on purpose); answered once
    /// the supervisor will restart none, so that the caller stops them only then.
    Quiesce(ractor::RpcReplyPort<()>),
}

pub(crate) struct Supervisor {
    pub(crate) transport: InProcessTransport,
}

pub(crate) struct SupervisorState {
    slots: HashMap<ActorId, ChildSpec>,
    quiescing: bool,
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = Vec<ChildSpec>;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        specs: Vec<ChildSpec>,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let mut slots = HashMap::new();
        for spec in specs {
            let child = spec.spawn(&myself).await?;
            self.transport.register(&spec.destination(), child.clone());
            slots.insert(child.get_id(), spec);
        }
        Ok(SupervisorState {
            slots,
            quiescing: false,
        })
    }

    async fn handle(
        &self,
        _: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Quiesce(done) => {
                state.quiescing = true;
                let _ = done.send(());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, err.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.unwrap_or_else(|| "stopped".into()))
            }
            _ => return Ok(()),
        };
        let Some(spec) = state.slots.remove(&cell.get_id()) else {
            return Ok(());
        };
        if state.quiescing {
            return Ok(());
        }
        let destination = spec.destination();
        tracing::error!(%destination, reason = %why, "actor died; restarting it");
        let child = spec.spawn(&myself).await?;
        self.transport.register(&destination, child.clone());
        state.slots.insert(child.get_id(), spec);
        Ok(())
    }
}
