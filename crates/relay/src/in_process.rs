//! The in-process transport: envelopes go to local actors' mailboxes.
//!
//! Destinations are registered in the transport's own map (not in ractor's global
//! registry, which is one per process, so that several runtimes can share a process).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use agentsaga_core::Envelope;
use ractor::rpc::CallResult;
use ractor::{ActorRef, ActorStatus, RpcReplyPort};

use crate::{Delivery, Transport};

/// What a destination actor receives: the envelope, and the port to answer on.
///
/// The actor answers with [`Delivery::Delivered`] once the message is safely its own
/// (typically after its inbox transaction committed), [`Delivery::Retry`] if it cannot
/// take it now, or [`Delivery::Reject`] if it never will. A destination with no actor
/// registered, or whose actor is gone before the message reached its mailbox, is
/// [`Delivery::Unavailable`]: nothing reached it, and its rows wait (attempts not
/// spent) until an actor is registered again. Not answering (dropping the
/// port, dying, exceeding the transport's timeout) counts as a retry.
#[derive(Debug)]
pub struct Deliver {
    /// The message.
    pub envelope: Envelope,
    /// Where the outcome goes.
    pub reply: RpcReplyPort<Delivery>,
    /// Resolves (with an error: nothing is ever sent on it) when the delivery is
    /// abandoned: the relay lost the row's lease, or stopped. The actor should then
    /// stop the work (drop its future): the row is no longer this delivery's.
    pub abandoned: tokio::sync::oneshot::Receiver<std::convert::Infallible>,
    /// Until when the row is surely this delivery's by the local clock: run the work
    /// under [`Lease::fence`](crate::lease::Lease::fence) so that it takes no step past
    /// it (a process frozen past its leases sends no late request when it thaws, even
    /// before it hears that it lost them).
    pub lease: crate::lease::Lease,
}

/// Delivers to actors in this process.
///
/// Several actors may serve one destination: a keyed message goes to the actor picked by
/// the hash of its key (the same one each time while the set of actors is unchanged), a
/// keyless one round robin. Clones share the registry.
///
/// ```
/// use agentsaga_relay::in_process::{Deliver, InProcessTransport};
/// use agentsaga_relay::Delivery;
/// use ractor::{Actor, ActorProcessingErr, ActorRef};
///
/// struct Billing;
///
/// impl Actor for Billing {
///     type Msg = Deliver;
///     type State = ();
///     type Arguments = ();
///     async fn pre_start(&self, _: ActorRef<Deliver>, _: ()) -> Result<(), ActorProcessingErr> {
///         Ok(())
///     }
///     async fn handle(&self, _: ActorRef<Deliver>, msg: Deliver, _: &mut ()) -> Result<(), ActorProcessingErr> {
///         // ... record msg.envelope.id in the inbox, in the transaction of the effects ...
///         let _ = msg.reply.send(Delivery::Delivered);
///         Ok(())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let transport = InProcessTransport::new();
/// let (billing, _) = Actor::spawn(None, Billing, ()).await?;
/// transport.register("billing", billing);
/// assert_eq!(transport.destinations(), vec!["billing".to_string()]);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct InProcessTransport {
    routes: Arc<RwLock<HashMap<String, Vec<ActorRef<Deliver>>>>>,
    next: Arc<AtomicUsize>,
    timeout: Option<Duration>,
}

impl Default for InProcessTransport {
    fn default() -> Self {
        Self::new()
    }
}

impl InProcessTransport {
    /// An empty registry. An actor may take as long as it needs to answer: the relay
    /// renews the row's lease meanwhile, and a handler's own bound (a saga step's
    /// timeout) is the actor's business.
    pub fn new() -> Self {
        Self {
            routes: Arc::default(),
            next: Arc::default(),
            timeout: None,
        }
    }

    /// How long an actor may take to answer before the delivery counts as a retry
    /// (default: no limit).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Adds `actor` to the actors serving `destination`. Actors of that destination that
    /// have stopped are dropped from the registry here (a supervisor registering the
    /// replacement of a dead actor does not leave the dead one behind).
    pub fn register(&self, destination: &str, actor: ActorRef<Deliver>) {
        let mut routes = self.write();
        let actors = routes.entry(destination.to_owned()).or_default();
        actors.retain(|a| a.get_status() < ActorStatus::Stopping);
        actors.push(actor);
    }

    /// Removes every actor serving `destination`; its messages wait (as retries) until
    /// one is registered again.
    pub fn unregister(&self, destination: &str) {
        self.write().remove(destination);
    }

    /// The destinations with at least one actor, sorted.
    pub fn destinations(&self) -> Vec<String> {
        let routes = self.routes.read().unwrap_or_else(PoisonError::into_inner);
        let mut names: Vec<String> = routes
            .iter()
            .filter(|(_, actors)| !actors.is_empty())
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Vec<ActorRef<Deliver>>>> {
        self.routes.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The actor for this envelope, skipping actors that have stopped.
    fn pick(&self, envelope: &Envelope) -> Option<ActorRef<Deliver>> {
        let routes = self.routes.read().unwrap_or_else(PoisonError::into_inner);
        let live: Vec<&ActorRef<Deliver>> = routes
            .get(&envelope.destination)?
            .iter()
            .filter(|a| a.get_status() < ActorStatus::Stopping)
            .collect();
        if live.is_empty() {
            return None;
        }
        let index = match &envelope.key {
            Some(key) => {
                let mut h = DefaultHasher::new();
                key.hash(&mut h);
                (h.finish() % live.len() as u64) as usize
            }
            None => self.next.fetch_add(1, Ordering::Relaxed) % live.len(),
        };
        Some(live[index].clone())
    }
}

#[async_trait::async_trait]
impl Transport for InProcessTransport {
    async fn deliver(&self, envelope: &Envelope) -> Delivery {
        let destination = &envelope.destination;
        // The registry lock is released before the call: never held across an await.
        let Some(actor) = self.pick(envelope) else {
            // Not reached at all (its actor not started yet, or being restarted): the
            // row waits, spending nothing, however long that takes.
            return Delivery::unavailable(format!("no actor for destination {destination}"));
        };
        let envelope = envelope.clone();
        // Dropped with this future (the relay cancels a delivery whose lease it lost):
        // the actor's `abandoned` then resolves.
        let (_held, abandoned) = tokio::sync::oneshot::channel();
        match actor
            .call(
                |reply| Deliver {
                    envelope,
                    reply,
                    abandoned,
                    lease: crate::lease::current(),
                },
                self.timeout,
            )
            .await
        {
            Ok(CallResult::Success(delivery)) => delivery,
            Ok(CallResult::Timeout) => Delivery::retry(format!(
                "the actor for destination {destination} did not answer within {:?}",
                self.timeout.unwrap_or_default()
            )),
            Ok(CallResult::SenderError) => Delivery::retry(format!(
                "the actor for destination {destination} dropped the reply (it stopped or failed)"
            )),
            // The message never reached its mailbox.
            Err(e) => Delivery::unavailable(format!(
                "the actor for destination {destination} is gone: {e}"
            )),
        }
    }
}
