//! The actor every agent and orchestrator destination is served by: it takes the
//! relay's deliveries, runs each as a bounded task of its own (fenced by the
//! delivery's lease, cancelled when the relay abandons it or the actor stops), and
//! answers the relay with the outcome.

use std::sync::Arc;

use agentsaga_core::Envelope;
use agentsaga_relay::Delivery;
use agentsaga_relay::in_process::Deliver;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::{Semaphore, watch};

/// Something that turns one delivered envelope into an outcome: an agent with its
/// store, or the orchestrator.
#[async_trait::async_trait]
pub(crate) trait DeliveryHandler: Send + Sync + 'static {
    async fn handle(&self, env: &Envelope) -> Delivery;
}

/// The actor of one destination: answers each [`Deliver`] with its handler's outcome.
/// Each delivery runs in a task of its own, at most `concurrency` at once; while all
/// are taken, the actor waits for one to finish before it reads its next message (the
/// relay, whose deliveries wait for their answers, feels that as backpressure). A
/// panic in a handler drops its answer, which the relay counts as a retry.
pub(crate) struct DeliveryActor<H> {
    pub(crate) handler: Arc<H>,
    pub(crate) concurrency: usize,
}

pub(crate) struct DeliveryState {
    permits: Arc<Semaphore>,
    /// Set on stop: tasks still running drop their work (the relay has released, or
    /// will redeliver, their messages).
    stop: watch::Sender<bool>,
}

impl<H: DeliveryHandler> Actor for DeliveryActor<H> {
    type Msg = Deliver;
    type State = DeliveryState;
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ActorRef<Deliver>,
        (): (),
    ) -> Result<DeliveryState, ActorProcessingErr> {
        Ok(DeliveryState {
            permits: Arc::new(Semaphore::new(self.concurrency.max(1))),
            stop: watch::Sender::new(false),
        })
    }

    async fn handle(
        &self,
        _: ActorRef<Deliver>,
        msg: Deliver,
        state: &mut DeliveryState,
    ) -> Result<(), ActorProcessingErr> {
        let permit = Arc::clone(&state.permits).acquire_owned().await?;
        let handler = Arc::clone(&self.handler);
        let mut stop = state.stop.subscribe();
        tokio::spawn(async move {
            let _permit = permit;
            let Deliver {
                envelope,
                reply,
                abandoned,
                lease,
            } = msg;
            tokio::select! {
                // The work takes no step past the lease's local deadline: a process
                // frozen past it sends no late outside call when it thaws, before it
                // even hears (at its next renewal) that the row is another's.
                delivery = lease.fence(handler.handle(&envelope)) => match delivery {
                    Some(delivery) => {
                        let _ = reply.send(delivery);
                    }
                    None => {
                        tracing::warn!(message.id = %envelope.id, "delivery past its lease's local deadline: work stopped");
                    }
                },
                _ = stop.wait_for(|stopped| *stopped) => {}
                // The relay gave the delivery up (it lost the row's lease): the work
                // stops here, an outside call with it.
                _ = abandoned => {
                    tracing::warn!(message.id = %envelope.id, "delivery abandoned by the relay (lease lost): work cancelled");
                }
            }
        });
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<Deliver>,
        state: &mut DeliveryState,
    ) -> Result<(), ActorProcessingErr> {
        state.stop.send_replace(true);
        Ok(())
    }
}
