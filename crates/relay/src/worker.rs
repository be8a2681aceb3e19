//! The delivery pool: a `ractor` factory of workers, each handing one envelope at a
//! time to the transport and reporting the outcome to the claimer.
//!
//! Jobs are keyed by the message's ordering key and routed with
//! [`StickyQueuerRouting`]: a key already in progress on a worker goes to that worker.
//! Per-key order does not depend on it (the claim query never hands out two rows of one
//! key at once); it keeps a key's traffic on one worker.

use std::sync::Arc;

use agentsaga_core::Envelope;
use ractor::factory::queues::DefaultQueue;
use ractor::factory::routing::StickyQueuerRouting;
use ractor::factory::{
    Factory, FactoryArguments, FactoryMessage, FactoryRef, Job, Worker, WorkerId, worker_builder,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, SpawnErr};
use tracing::Instrument;

use crate::Delivery;
use crate::claimer::msg::{ClaimerMsg, Done};
use crate::transport::Transport;

/// A job's routing key: the ordering key, or for keyless messages the row itself (so
/// that keyless messages spread over all workers).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum RouteKey {
    Key(String),
    Row(i64),
}

impl RouteKey {
    pub(crate) fn of(envelope: &Envelope) -> Self {
        envelope
            .key
            .clone()
            .map_or(Self::Row(envelope.seq), Self::Key)
    }
}

/// One delivery of a row: the row, its number at this relay (a re-claim of the row is
/// another delivery, and the outcome of the old one is not the new one's), and the
/// signal that the relay lost the row's lease.
pub(crate) struct Task {
    pub(crate) envelope: Arc<Envelope>,
    pub(crate) delivery: u64,
    pub(crate) lost: tokio::sync::watch::Receiver<bool>,
    /// Until when the row is surely this delivery's (moved on by renewals).
    pub(crate) lease: crate::lease::Lease,
}

type Msg = Arc<Task>;

/// The factory's handle, through which the claimer dispatches envelopes.
pub(crate) type PoolRef = FactoryRef<RouteKey, Msg>;

type Pool = Factory<
    RouteKey,
    Msg,
    (),
    DeliveryWorker,
    StickyQueuerRouting<RouteKey, Msg>,
    DefaultQueue<RouteKey, Msg>,
>;

/// Spawns the pool of `workers`, supervised by (linked to) the claimer.
pub(crate) async fn spawn_pool(
    workers: usize,
    transport: Arc<dyn Transport>,
    claimer: ActorRef<ClaimerMsg>,
    clock: agentsaga_core::clock::Clock,
) -> Result<PoolRef, SpawnErr> {
    let supervisor = claimer.get_cell();
    let args = FactoryArguments::builder()
        .worker_builder(Box::new(worker_builder(move |_wid| {
            let worker = DeliveryWorker {
                transport: Arc::clone(&transport),
                claimer: claimer.clone(),
                clock: clock.clone(),
            };
            (worker, ())
        })))
        .queue(DefaultQueue::default())
        .router(StickyQueuerRouting::default())
        .num_initial_workers(workers)
        .build();
    let (pool, _join) = Actor::spawn_linked(None, Pool::default(), args, supervisor).await?;
    Ok(pool)
}

/// One delivery worker of the pool.
pub(crate) struct DeliveryWorker {
    transport: Arc<dyn Transport>,
    claimer: ActorRef<ClaimerMsg>,
    /// The store's clock: when a delivery finished counts from it.
    clock: agentsaga_core::clock::Clock,
}

impl Worker for DeliveryWorker {
    type Key = RouteKey;
    type Message = Msg;
    type Arguments = ();
    type State = ();

    async fn pre_start(
        &self,
        _wid: WorkerId,
        _factory: &ActorRef<FactoryMessage<RouteKey, Msg>>,
        _args: (),
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _wid: WorkerId,
        _factory: &ActorRef<FactoryMessage<RouteKey, Msg>>,
        Job { key, msg, .. }: Job<RouteKey, Msg>,
        _state: &mut (),
    ) -> Result<RouteKey, ActorProcessingErr> {
        let delivery = deliver_while_leased(
            &self.transport,
            Arc::clone(&msg.envelope),
            msg.lost.clone(),
            msg.lease.clone(),
        )
        .await;
        let seq = msg.envelope.seq;
        let done = Done {
            seq,
            number: msg.delivery,
            delivery,
            finished_ms: self.clock.now_ms(),
        };
        if self.claimer.cast(ClaimerMsg::Done(done)).is_err() {
            // The claimer is gone (shut down): the row's lease runs out and another
            // relay delivers it again.
            tracing::debug!(seq, "relay claimer gone; outcome dropped");
        }
        Ok(key)
    }
}

/// [`deliver`], cancelled if the relay loses the row's lease meanwhile (`lost` turns
/// true): the transport's future is dropped (an agent's outside call with it), for the
/// row may already be another delivery's, whose compensation may be under way. Its
/// outcome is then a retry that the claimer drops (the row is not this delivery's).
pub(crate) async fn deliver_while_leased(
    transport: &Arc<dyn Transport>,
    envelope: Arc<Envelope>,
    mut lost: tokio::sync::watch::Receiver<bool>,
    lease: crate::lease::Lease,
) -> Delivery {
    let seq = envelope.seq;
    let lost = async move {
        if lost.wait_for(|lost| *lost).await.is_err() {
            // The claimer let go of the delivery without a loss: never fires.
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        delivery = deliver(transport, envelope, lease) => delivery,
        () = lost => {
            tracing::warn!(seq, "relay lost the lease of a row it was delivering; delivery cancelled");
            Delivery::retry("the relay lost the row's lease: delivery cancelled")
        }
    }
}

/// One delivery attempt in its own span. The transport runs in a task of its own so a
/// panic in it is an outcome (a retry), not a dead worker and a lost job; if the worker
/// is killed (shutdown), dropping the guard aborts the task.
///
/// The span's parent is the producer's span, from the `traceparent` header (through the
/// propagator the runtime installs), so one saga reads as one trace; never the worker's
/// whole-life ractor `Actor` span.
pub(crate) async fn deliver(
    transport: &Arc<dyn Transport>,
    envelope: Arc<Envelope>,
    lease: crate::lease::Lease,
) -> Delivery {
    let span = tracing::info_span!(
        parent: None,
        "relay.deliver",
        message.id = %envelope.id,
        message.destination = %envelope.destination,
        attempt = envelope.attempts,
        otel.kind = "consumer",
        outcome = tracing::field::Empty,
        saga.id = envelope.header(agentsaga_core::header::SAGA_ID).unwrap_or_default(),
    );
    // The delivery hangs under the producer's span (the `traceparent` captured at
    // enqueue), and hands its own context on, so the consumer's span hangs under it.
    agentsaga_core::propagation::adopt(&span, &envelope.headers);
    let envelope = match envelope.header(agentsaga_core::header::TRACEPARENT) {
        Some(_) => {
            let mut handed = (*envelope).clone();
            span.in_scope(|| agentsaga_core::propagation::inject_current(&mut handed.headers));
            Arc::new(handed)
        }
        None => envelope,
    };
    let transport = Arc::clone(transport);
    let task = AbortOnDrop(tokio::spawn(
        crate::lease::scope(lease, async move { transport.deliver(&envelope).await })
            .instrument(span.clone()),
    ));
    let delivery = match task.join().await {
        Ok(delivery) => delivery,
        Err(e) if e.is_panic() => Delivery::retry(format!(
            "the transport panicked: {}",
            panic_message(e.into_panic())
        )),
        Err(_) => Delivery::retry("the delivery was cancelled"),
    };
    span.record("outcome", delivery.kind());
    if let Delivery::Retry { reason, .. } | Delivery::Reject { reason } = &delivery {
        span.in_scope(|| tracing::debug!(outcome = delivery.kind(), %reason, "delivery failed"));
    }
    delivery
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    async fn join(mut self) -> Result<T, tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Lease;

    struct Panics;

    #[async_trait::async_trait]
    impl Transport for Panics {
        async fn deliver(&self, _envelope: &Envelope) -> Delivery {
            panic!("boom");
        }
    }

    fn envelope(key: Option<&str>) -> Envelope {
        Envelope {
            seq: 7,
            key: key.map(str::to_owned),
            ..agentsaga_core::testing::envelope("d", "null", [])
        }
    }

    #[tokio::test]
    async fn a_panicking_transport_is_a_retry() {
        let transport: Arc<dyn Transport> = Arc::new(Panics);
        let d = deliver(&transport, Arc::new(envelope(None)), Lease::unbounded()).await;
        match d {
            Delivery::Retry { reason, after } => {
                assert!(reason.contains("panicked: boom"), "{reason}");
                assert_eq!(after, None);
            }
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    /// A span as created: name, whether it is a root, its fields as `name=value`.
    type SpanRecord = (String, bool, Vec<String>);

    /// Records the spans created.
    #[derive(Clone, Default)]
    struct Spans(Arc<std::sync::Mutex<Vec<SpanRecord>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _id: &tracing::span::Id,
            _ctx: tracing_subscriber::layer::Context<'_, S>,
        ) {
            struct Fields(Vec<String>);
            impl tracing::field::Visit for Fields {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    self.0.push(format!("{}={v:?}", f.name()));
                }
            }
            let mut fields = Fields(Vec::new());
            attrs.record(&mut fields);
            let name = attrs.metadata().name().to_owned();
            self.0
                .lock()
                .unwrap()
                .push((name, attrs.is_root(), fields.0));
        }
    }

    struct Accepts;

    #[async_trait::async_trait]
    impl Transport for Accepts {
        async fn deliver(&self, _envelope: &Envelope) -> Delivery {
            Delivery::Delivered
        }
    }

    #[tokio::test]
    async fn each_delivery_has_a_consumer_span() {
        use tracing_subscriber::layer::SubscriberExt;
        let spans = Spans::default();
        let _guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
        let transport: Arc<dyn Transport> = Arc::new(Accepts);
        let outer = tracing::info_span!("worker");
        let env = envelope(Some("k"));
        let id = env.id;
        let d = deliver(&transport, Arc::new(env), Lease::unbounded())
            .instrument(outer)
            .await;
        assert_eq!(d, Delivery::Delivered);
        let spans = spans.0.lock().unwrap().clone();
        let (_, root, fields) = spans
            .iter()
            .find(|(name, ..)| name == "relay.deliver")
            .expect("a relay.deliver span");
        assert!(root, "not nested under the worker's span");
        for expected in [
            format!("message.id={id}"),
            "message.destination=d".to_owned(),
            "attempt=1".to_owned(),
            "otel.kind=\"consumer\"".to_owned(),
        ] {
            assert!(fields.contains(&expected), "{expected} not in {fields:?}");
        }
    }

    #[test]
    fn keyless_rows_route_by_row() {
        assert_eq!(
            RouteKey::of(&envelope(Some("k"))),
            RouteKey::Key("k".into())
        );
        assert_eq!(RouteKey::of(&envelope(None)), RouteKey::Row(7));
    }
}
