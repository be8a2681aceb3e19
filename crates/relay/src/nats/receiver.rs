//! The receiving side: [`NatsReceiver`] consumes the subjects of a service's
//! destinations durably and stores each message in the service's own outbox,
//! acknowledging JetStream only after the commit (the contract: the module `nats`).

use std::sync::Arc;

use agentsaga_core::Store;
use async_nats::jetstream::{self, consumer::AckPolicy};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::batch::Batcher;
use super::config::NatsReceiverConfig;
use super::counters::{Counters, ReceiverStats};
use super::worker::{Worker, consumer};
use super::{NatsConnect, NatsError, jetstream_at};

/// Consumes a JetStream stream into the local store (see the module `nats`).
///
/// Each destination has its own durable pull consumer, named
/// `<durable>_<destination>` (dots in the destination as `_`), filtered on its subject
/// (explicit acks, `max_deliver` -1, `max_ack_pending` the batch size), and its own
/// task: one destination's messages are stored in stream order, each key's in the
/// publisher's (a key's messages to two destinations are two orders, as two
/// consumers). One consumer per destination rather than one with several filter
/// subjects: those need nats-server 2.10 (and async-nats's `server_2_10` feature);
/// this works on 2.9 too.
///
/// A consumer that exists already is used as it is (its settings kept), if its filter
/// is its destination's subject. Stop the receiver with [`stop`](Self::stop); dropping
/// it aborts the tasks (a batch being stored is rolled back, and comes again).
///
/// ```no_run
/// use agentsaga_core::Store;
/// use agentsaga_relay::nats::{NatsReceiver, NatsReceiverConfig};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // The payments service, its own database: what is published for "payments" lands
/// // in its outbox, and its own relay hands it to its agents.
/// let store = Store::connect("sqlite:///var/lib/payments/agentsaga.db").await?;
/// let receiver = NatsReceiver::start(
///     "nats://127.0.0.1:4222",
///     store,
///     NatsReceiverConfig::new("AGENTSAGA", "payments-service").destinations(["payments"]),
/// )
/// .await?;
/// // ...
/// receiver.stop().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct NatsReceiver {
    tasks: JoinSet<()>,
    stop: watch::Sender<bool>,
    counters: Arc<Counters>,
}

impl NatsReceiver {
    /// Connects to the server as `to` says (a URL or a [`NatsConnect`]), makes (or
    /// finds) the consumers, and starts consuming into `store`. Once started it does not
    /// fail: a server away or a store failing is waited out, with backoff.
    ///
    /// # Errors
    /// [`NatsError::Config`] for a configuration that cannot work;
    /// [`NatsError::Connect`] if the server cannot be reached or refuses the
    /// credentials; [`NatsError::Credentials`] for a credentials or TLS file that cannot
    /// be used; [`NatsError::Stream`]
    /// if the stream does not exist; [`NatsError::Consumer`] if a consumer cannot be
    /// made, or exists with another filter.
    pub async fn start(
        to: impl Into<NatsConnect>,
        store: Store,
        config: NatsReceiverConfig,
    ) -> Result<Self, NatsError> {
        let subjects = config.subjects()?;
        let js = jetstream_at(&to.into()).await?;
        let counters = Arc::new(Counters::default());
        let (stop, stopped) = watch::channel(false);
        let mut workers = Vec::with_capacity(subjects.len());
        for (destination, subject) in config.destinations.iter().zip(subjects) {
            let durable = config.consumer_name(destination);
            let pull = jetstream::consumer::pull::Config {
                durable_name: Some(durable),
                filter_subject: subject,
                ack_policy: AckPolicy::Explicit,
                ack_wait: config.ack_wait,
                max_deliver: -1,
                max_ack_pending: i64::try_from(config.batch_size).unwrap_or(i64::MAX),
                ..Default::default()
            };
            let first = consumer(&js, &config.stream, &pull).await?;
            let worker = Worker {
                js: js.clone(),
                stream: config.stream.clone(),
                consumer: pull,
                batcher: Batcher {
                    store: store.clone(),
                    stream: config.stream.clone(),
                    prefix: config.prefix.clone(),
                    destinations: vec![destination.clone()],
                    counters: Arc::clone(&counters),
                },
                batch_size: config.batch_size,
                fetch_wait: config.fetch_wait,
                ack_wait: config.ack_wait,
            };
            workers.push((worker, first));
        }
        let mut tasks = JoinSet::new();
        for (worker, first) in workers {
            tasks.spawn(worker.run(first, stopped.clone()));
        }
        Ok(Self {
            tasks,
            stop,
            counters,
        })
    }

    /// What the receiver has done so far.
    pub fn stats(&self) -> ReceiverStats {
        self.counters.snapshot()
    }

    /// Stops consuming and waits for the tasks to end: a batch being stored is
    /// committed and acknowledged (or handed back) first; nothing is fetched after. A
    /// fetch under way is dropped: a message the server sent it at that moment comes
    /// back after `ack_wait` (the next receiver waits for it).
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        while let Some(done) = self.tasks.join_next().await {
            if let Err(e) = done {
                tracing::error!(error = %e, "a NATS receiver task ended abnormally");
            }
        }
    }
}
