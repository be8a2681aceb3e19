//! The orchestrator's side: sagas advanced with the engine, one message (one
//! transaction) at a time, and the news of sagas that settled.

use super::*;

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
        let span = step_span(&env.destination, env.id, &env.headers, false);
        agentsaga_core::propagation::adopt(&span, &env.headers);
        self.process_in_span(env).instrument(span).await
    }

    async fn process_in_span(&self, env: &Envelope) -> Delivery {
        // The hop records the message in the inbox and reads its saga when it opens
        // (on SQLite in one round trip, on PostgreSQL with its batch's set lane).
        let (mut tx, read) = match open_hop(&self.store, env, self.engine.prefetch_for(env)).await {
            Ok(opened) => opened,
            Err(delivery) => return delivery,
        };
        // The engine's save and messages end the hop: they may be written in the round
        // trip that ends it (SQLite), or with its batch's statements (PostgreSQL).
        tx.defer_next_write();
        let read = read.as_ref().map(|(id, r)| (*id, r));
        match self.engine.handle_received(&mut tx, env, read).await {
            Ok(handled) => commit_hop(tx, Some(handled), Some(self)).await,
            Err(agentsaga_saga::Error::VersionNotRegistered { name, version }) => {
                // Leave it for a process that has this version; check back later.
                tracing::warn!(%name, version, "saga version not registered here");
                Delivery::retry_after(
                    format!("saga {name} v{version} not registered"),
                    Duration::from_secs(30),
                )
            }
            Err(agentsaga_saga::Error::Store(e)) if e.is_transient() => infra(e),
            Err(e) => {
                // Trying again will not help (the saga's data outgrew the message
                // limit, a malformed message...): tell the saga, so that it does not
                // wait forever, and dead-letter the message if even that fails.
                drop(tx);
                let reason = e.to_string();
                tracing::warn!(error = %reason, "cannot process a saga message; failing the saga");
                let mut tx = match self.store.begin().await {
                    Ok(tx) => tx,
                    Err(e) => return infra(e),
                };
                match self.engine.fail(&mut tx, env, &reason).await {
                    Ok(handled) => commit_hop(tx, Some(handled), Some(self)).await,
                    Err(agentsaga_saga::Error::Store(e)) if e.is_transient() => infra(e),
                    Err(e2) => {
                        Delivery::reject(format!("{reason} (and failing its saga failed: {e2})"))
                    }
                }
            }
        }
    }

    pub(crate) async fn report_settled(&self, handled: Handled) {
        if let Handled::Advanced { saga, state } = handled
            && (state.is_terminal() || state == SagaState::Stuck)
        {
            tracing::info!(%state, "saga settled");
            crate::metrics::saga_finished(&self.store, saga).await;
            let _ = self.settled.send(Settled { saga, state });
        }
    }
}

#[async_trait::async_trait]
impl DeliveryHandler for Orchestrator {
    async fn handle(&self, env: &Envelope) -> Delivery {
        self.process(env).await
    }
}
