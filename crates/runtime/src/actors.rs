//! The actors: agent actors run an [`Agent`]'s handler, orchestrator actors run the
//! saga engine. Both take [`Deliver`] messages from the relay's in-process transport
//! and answer only once their transaction has committed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::read::Prefetched;
use agentsaga_core::{Envelope, Hop, Receipt, Store, header};
use agentsaga_relay::Delivery;
use agentsaga_saga::{Engine, Handled, SagaId, SagaState, StepOutcome, Usage, protocol};

use agentsaga_core::clock::{Clock, Instant};
use serde::Serialize;
use tokio::sync::broadcast;
use tracing::Instrument;

use crate::agent::{CallContext, Meter, StepError};

mod delivery;
mod faults;
mod orchestrator;
mod runners;
#[cfg(test)]
mod tests;

pub(crate) use delivery::{DeliveryActor, DeliveryHandler};
pub(crate) use orchestrator::{Orchestrator, Settled};

/// An agent behind one object type, whichever trait it implements: what its delivery
/// actor runs.
#[async_trait::async_trait]
pub(crate) trait AgentRunner: Send + Sync + 'static {
    fn destination(&self) -> &str;
    /// Does its work wait on the outside world (sized for waiting, not for CPU)?
    fn calls_out(&self) -> bool;
    async fn run(&self, hub: &Hub, env: &Envelope) -> Delivery;
}

/// Where an agent's outcomes go: its store, and this process's sagas, whose engine
/// applies an agent's answer in the agent's own transaction.
pub(crate) struct Hub {
    pub(crate) store: Store,
    /// The agent's destination's rate limit, if it has one.
    pub(crate) limit: Option<crate::RateLimit>,
    /// `None`: every answer goes through the outbox (no sagas here, or turned off).
    pub(crate) sagas: Option<Arc<Orchestrator>>,
    /// A test's faults (feature `testing`; never armed without it).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) faults: Arc<crate::faults::Faults>,
}

impl Hub {
    /// Applies `answer` to its saga in `tx` when that saga is run here and this is the
    /// command's first delivery: `Ok(Some(_))` if it did, `Ok(None)` (nothing written)
    /// if `answer` must go through the outbox. A redelivered command always sends its
    /// answer through the outbox: if applying failed once (a saga whose data outgrew
    /// its limit, a version missing here), the next attempt takes the path whose
    /// failures the orchestrator knows how to handle.
    ///
    /// # Errors
    /// Why applying failed; `tx` is then unusable (roll it back).
    async fn apply(
        &self,
        tx: &mut Hop,
        env: &Envelope,
        answer: &agentsaga_core::Message,
        read: &Read,
    ) -> Result<Option<Handled>, String> {
        let Some(sagas) = self.applies_here(env, &answer.destination) else {
            return Ok(None);
        };
        let span = step_span(&answer.destination, answer.id, &answer.headers, true);
        // Applying is the hop's last work: its save and next messages may be written in
        // the round trip that ends the hop (SQLite).
        tx.defer_next_write();
        sagas
            .engine
            .apply_local_prefetched(tx, answer, read.as_ref().map(|(id, r)| (*id, r)))
            .instrument(span)
            .await
            .map_err(|e| {
                format!(
                    "applying the answer to its saga in the agent's transaction failed ({e}); \
                     the next attempt sends it through the outbox"
                )
            })
    }
}

/// The `saga.step` span of one message to an orchestrator: delivered to the
/// orchestrator actor (a consumer), or applied in the agent's transaction that made it.
fn step_span(
    destination: &str,
    id: agentsaga_core::MessageId,
    headers: &agentsaga_core::Headers,
    in_agent: bool,
) -> tracing::Span {
    let get = |name: &str| headers.get(name).map(String::as_str).unwrap_or_default();
    tracing::info_span!(
        "saga.step",
        otel.kind = if in_agent { "internal" } else { "consumer" },
        saga.id = get(header::SAGA_ID),
        saga.name = %destination,
        step.name = get(protocol::STEP_NAME),
        message.kind = get(header::KIND),
        message.id = %id,
        applied_in = if in_agent { "agent" } else { "orchestrator" },
    )
}

/// An [`Agent`] (database only), erased.
pub(crate) struct Local<A>(pub(crate) A);

/// A [`CallingAgent`], erased.
pub(crate) struct Calling<A>(pub(crate) A);

fn infra(e: impl std::fmt::Display) -> Delivery {
    Delivery::retry(format!("database: {e}"))
}

fn agent_span(env: &Envelope) -> tracing::Span {
    let span = tracing::info_span!(
        "agent.handle",
        otel.kind = "consumer",
        agent = %env.destination,
        message.id = %env.id,
        saga.id = env.header(header::SAGA_ID).unwrap_or_default(),
        step.name = env.header(protocol::STEP_NAME).unwrap_or_default(),
        compensation = protocol::is_compensation(env),
        timed_out = tracing::field::Empty,
    );
    agentsaga_core::propagation::adopt(&span, &env.headers);
    span
}

fn decode<C: serde::de::DeserializeOwned>(env: &Envelope) -> Result<C, Delivery> {
    env.decode().map_err(|e| {
        Delivery::reject(format!(
            "payload does not decode into {}: {e}",
            std::any::type_name::<C>()
        ))
    })
}

/// When the work on `env` must be done by: its `timeout_ms` from now on the store's
/// clock, if it has one.
fn deadline_of(env: &Envelope, clock: &Clock) -> Option<Instant> {
    CallContext::new(env).timeout().map(|t| clock.now() + t)
}

/// Runs a handler that holds a hop (`handle`, `record`) until the step's `deadline`
/// (`Ok(None)` past it, the step's timeout rules apply) and at most the store's
/// `hop_timeout`: a hop holds a turn in a shared transaction (on SQLite, every write of
/// the process waits behind it), so a handler that does not come back within it is
/// dropped, its hop undone, and the delivery retried (`Err`).
async fn holding<F: Future>(
    hub: &Hub,
    deadline: Option<Instant>,
    work: F,
) -> Result<Option<F::Output>, Delivery> {
    let bound = hub.store.config().hop_timeout;
    match tokio::time::timeout(bound, bounded(hub.store.clock(), deadline, work)).await {
        Ok(done) => Ok(done),
        Err(_) => {
            tracing::error!(
                hop_timeout_ms = bound.as_millis() as u64,
                "a handler held its hop past hop_timeout: dropped, its effects undone, the delivery retried"
            );
            Err(Delivery::retry(format!(
                "the handler held its database turn past hop_timeout ({bound:?}): its work was dropped"
            )))
        }
    }
}

/// Runs `work` until `deadline` on `clock`; `None` if the deadline passed first (the
/// work is dropped, i.e. cancelled).
async fn bounded<F: Future>(
    clock: &Clock,
    deadline: Option<Instant>,
    work: F,
) -> Option<F::Output> {
    match deadline {
        Some(at) => clock.timeout_at(at, work).await,
        None => Some(work.await),
    }
}

impl Hub {
    /// This process's sagas, if an answer to `destination` for `env` is applied in the
    /// agent's own hop: the sagas run here, consume `destination`, and `env` is on its
    /// first delivery.
    fn applies_here(&self, env: &Envelope, destination: &str) -> Option<&Orchestrator> {
        let sagas = self.sagas.as_deref()?;
        (env.attempts <= 1 && sagas.engine.consumes(destination)).then_some(sagas)
    }
}

/// What an agent's hop read of its saga when it opened, for [`Hub::apply`] (SQLite).
type Read = Option<(SagaId, Prefetched)>;

impl Hub {
    /// The saga to read when the hop of `env`'s outcome opens: the one its answer will
    /// be applied to in that hop (see [`Hub::apply`]), if any.
    fn prefetch(&self, env: &Envelope) -> Option<(SagaId, agentsaga_core::read::Prefetch)> {
        let sagas = self.applies_here(env, env.header(header::REPLY_TO)?)?;
        let saga = protocol::saga_id(env).ok()?;
        Some((saga, sagas.engine.prefetch(saga)?))
    }
}

/// Begins the hop of a message's outcome (its turn in a shared transaction) and
/// records the message in the inbox, reading the saga its answer goes to in the same
/// round trip (SQLite): `Err` with the delivery to answer if that fails or it is a
/// duplicate.
async fn begin_received(hub: &Hub, env: &Envelope) -> Result<(Hop, Read), Delivery> {
    open_hop(&hub.store, env, hub.prefetch(env)).await
}

/// Opens the hop of `env` (an agent's outcome, or an orchestrator's message): its
/// turn in the driver's lane, the message recorded in the inbox, `prefetch` (the saga
/// the hop will advance) read as it opens; `Err` with the delivery to answer if that
/// fails or the message is a duplicate. The one way both kinds of actor open a hop.
pub(crate) async fn open_hop(
    store: &Store,
    env: &Envelope,
    prefetch: Option<(SagaId, agentsaga_core::read::Prefetch)>,
) -> Result<(Hop, Read), Delivery> {
    let (saga, prefetch) = prefetch.unzip();
    match store
        .hop_receiving_prefetched(&env.destination, env.id, prefetch)
        .await
    {
        Ok((tx, Receipt::First, read)) => Ok((tx, saga.zip(read))),
        Ok((_, Receipt::Duplicate, _)) => {
            tracing::debug!("duplicate delivery skipped");
            Err(Delivery::Delivered)
        }
        Err(e) => Err(infra(e)),
    }
}

/// Applies `reply` (if any) to its saga in `tx` if the saga runs here (see
/// [`Hub::apply`]), or enqueues it, and commits.
async fn commit_with(
    hub: &Hub,
    env: &Envelope,
    (mut tx, read): (Hop, Read),
    reply: agentsaga_core::Result<Option<agentsaga_core::Message>>,
) -> Delivery {
    let reply = match reply {
        Ok(reply) => reply,
        Err(e) => return Delivery::reject(e.to_string()),
    };
    let mut applied = None;
    if let Some(reply) = reply {
        match hub.apply(&mut tx, env, &reply, &read).await {
            Ok(Some(handled)) => applied = Some(handled),
            Ok(None) => {
                if let Err(e) = tx.enqueue(&reply).await {
                    return infra(e);
                }
            }
            Err(why) => {
                tracing::warn!(error = %why, "answer not applied in the agent's transaction");
                drop(tx); // rolls back
                return Delivery::retry(why);
            }
        }
    }
    commit_hop(tx, applied, hub.sagas.as_deref()).await
}

/// Commits a hop, then reports the saga it advanced (if any) to `sagas` if it settled:
/// the delivery's outcome. The one way both kinds of actor end a hop.
pub(crate) async fn commit_hop(
    tx: Hop,
    handled: Option<Handled>,
    sagas: Option<&Orchestrator>,
) -> Delivery {
    match tx.commit().await {
        Ok(()) => {
            if let (Some(handled), Some(sagas)) = (handled, sagas) {
                sagas.report_settled(handled).await;
            }
            Delivery::Delivered
        }
        Err(e) => infra(e),
    }
}

/// The work ran past its timeout and was cancelled: records the message as received
/// and tells the orchestrator, whose step-timeout rules take it from there.
async fn finish_timed_out(hub: &Hub, env: &Envelope) -> Delivery {
    tracing::Span::current().record("timed_out", true);
    tracing::info!(
        timeout_ms = env.header(header::TIMEOUT_MS).unwrap_or_default(),
        "work cancelled past the step's timeout"
    );
    match begin_received(hub, env).await {
        Ok(hop) => commit_with(hub, env, hop, Ok(protocol::timed_out(env))).await,
        Err(d) => d,
    }
}

/// What a handler's error records as its step's outcome; `Err`: the delivery to answer
/// instead, recording nothing (the message is delivered again).
fn failure(error: StepError) -> Result<StepOutcome, Delivery> {
    match error {
        StepError::Infrastructure(e) => Err(Delivery::retry(e)),
        e @ StepError::RateLimited { retry_after } => {
            let after = retry_after.unwrap_or(crate::rate_limit::DEFAULT_RETRY_AFTER);
            Err(Delivery::retry_after(e.to_string(), after))
        }
        StepError::Retryable(e) => Ok(StepOutcome::Retryable(e)),
        StepError::Fatal(e) => Ok(StepOutcome::Fatal(e)),
    }
}

/// Records a failure (the handler's effects, if any, already rolled back): the inbox
/// entry and the failure reply.
async fn finish_failed(hub: &Hub, env: &Envelope, error: StepError, usage: Usage) -> Delivery {
    let out = match failure(error) {
        Ok(out) => out,
        Err(d) => return d,
    };
    if let Some(e) = out.error() {
        tracing::info!(error = %e, "step failed");
    }
    match begin_received(hub, env).await {
        Ok(hop) => commit_with(hub, env, hop, reply_using(env, &out, &usage)).await,
        Err(d) => d,
    }
}

/// The reply to `env` with `out`, carrying what its work used.
fn reply_using(
    env: &Envelope,
    out: &StepOutcome,
    usage: &Usage,
) -> agentsaga_core::Result<Option<agentsaga_core::Message>> {
    protocol::reply(env, out).map(|r| r.map(|r| protocol::with_usage(r, usage)))
}

/// What a meter counted so far.
fn used(meter: &Meter) -> Usage {
    *meter
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Ends a message whose handler ran in `tx` (received already): commits its effects
/// and its reply, or rolls them back and records the failure, or the timeout; a
/// failure of a handler that did nothing in `tx` is recorded in `tx` itself.
async fn finish<R: Serialize>(
    hub: &Hub,
    env: &Envelope,
    (tx, read): (Hop, Read),
    result: Option<Result<R, StepError>>,
    usage: Usage,
) -> Delivery {
    let out = match result {
        None => {
            drop(tx); // rolls back
            return finish_timed_out(hub, env).await;
        }
        Some(Ok(reply)) => match serde_json::to_value(reply) {
            Ok(v) => StepOutcome::Ok(v),
            Err(e) => {
                drop(tx);
                return finish_failed(
                    hub,
                    env,
                    StepError::Fatal(format!("the reply does not serialize: {e}")),
                    usage,
                )
                .await;
            }
        },
        // A handler that failed having done nothing in its hop: the hop records the
        // failure itself (rolling it back would undo only its inbox record, and a
        // fresh hop would write it again). A failure that records nothing drops it.
        Some(Err(e)) if tx.is_untouched() => match failure(e) {
            Ok(out) => out,
            Err(d) => return d,
        },
        Some(Err(e)) => {
            drop(tx); // rolls back
            return finish_failed(hub, env, e, usage).await;
        }
    };
    if let Some(e) = out.error() {
        tracing::info!(error = %e, "step failed");
        return commit_with(hub, env, (tx, read), reply_using(env, &out, &usage)).await;
    }
    #[cfg(feature = "testing")]
    let noted = hub.faults.journal.noted(env);
    let delivery = commit_with(hub, env, (tx, read), reply_using(env, &out, &usage)).await;
    #[cfg(feature = "testing")]
    hub.faults
        .journal
        .settle(noted, matches!(delivery, Delivery::Delivered));
    delivery
}

/// An agent and where its outcomes go.
pub(crate) struct AgentHandler {
    pub(crate) agent: Arc<dyn AgentRunner>,
    pub(crate) hub: Hub,
}
