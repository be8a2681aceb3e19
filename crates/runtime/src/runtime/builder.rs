//! The runtime's builder: what a process hosts (agents, sagas), its store, relay,
//! concurrency, admission, retention and stall watch, then [`RuntimeBuilder::start`].

use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::RetryPolicy;
use agentsaga_core::{Store, StoreConfig};
use agentsaga_relay::in_process::InProcessTransport;
use agentsaga_relay::{Relay, RelayConfig};
use agentsaga_saga::{Engine, SagaDefinition};
use ractor::Actor;
use tokio::sync::broadcast;

use super::Runtime;
use crate::actors::{AgentRunner, Calling, Local};
use crate::supervisor::{ChildSpec, Supervisor};
use crate::{Agent, CallingAgent, Error, Result};

/// The database a runtime opens when given none: a SQLite file in the working
/// directory, created if missing.
pub const DEFAULT_DATABASE: &str = "sqlite://agentsaga.db";

/// Deliveries a database-only [`Agent`] handles at once unless told otherwise. Its
/// hops share transactions (SQLite's lane; on PostgreSQL the set lanes, whose
/// statements each serve a whole batch), and a batch holds at most the hops delivered
/// at once: 64 lets PostgreSQL's batches fill (at 16 they held ~8 hops, and the saga
/// bench made half the sagas/s). Handlers do not run in parallel any more for it: each
/// runs in its turn.
pub const DEFAULT_AGENT_CONCURRENCY: usize = 64;
/// Deliveries a [`CallingAgent`] works on at once unless told otherwise: sized for
/// waiting on the outside world, not for CPU.
pub const DEFAULT_CALLING_CONCURRENCY: usize = 512;
/// Deliveries a saga version's orchestrator works on at once unless told otherwise:
/// its hops share commits, so more at once means more hops per commit.
pub const DEFAULT_ORCHESTRATOR_CONCURRENCY: usize = 64;

/// Builds a [`Runtime`]. See [`Runtime::builder`].
#[must_use]
pub struct RuntimeBuilder {
    pub(super) url: Option<String>,
    pub(super) store: Option<Store>,
    pub(super) store_config: StoreConfig,
    agents: Vec<Arc<dyn AgentRunner>>,
    sagas: Vec<SagaDefinition>,
    agent_concurrency: usize,
    calling_concurrency: usize,
    concurrency: std::collections::HashMap<String, usize>,
    orchestrator_concurrency: usize,
    relay: RelayConfig,
    compensation_retry: Option<RetryPolicy>,
    delivery_timeout: Option<Duration>,
    metrics: Option<std::net::SocketAddr>,
    max_in_flight: Option<usize>,
    max_in_flight_for: Vec<(String, Option<usize>)>,
    retention: crate::Retention,
    stall_watch: crate::stalled::StallWatch,
    answers_in_agent_tx: bool,
    pub(super) faults: Arc<crate::faults::Faults>,
    /// Rate limits by destination (`RuntimeBuilder::rate_limit`).
    pub(crate) rate_limits: std::collections::HashMap<String, crate::RateLimit>,
    /// The link to other services, and the destinations sent over it (`linking.rs`).
    #[cfg(feature = "nats")]
    pub(super) nats: Option<crate::NatsLink>,
    #[cfg(feature = "nats")]
    pub(super) remote: Vec<String>,
}

impl RuntimeBuilder {
    /// The defaults [`Runtime::builder`] documents.
    pub(super) fn new() -> Self {
        RuntimeBuilder {
            url: None,
            store: None,
            store_config: StoreConfig::default(),
            agents: Vec::new(),
            sagas: Vec::new(),
            agent_concurrency: DEFAULT_AGENT_CONCURRENCY,
            calling_concurrency: DEFAULT_CALLING_CONCURRENCY,
            concurrency: std::collections::HashMap::new(),
            orchestrator_concurrency: DEFAULT_ORCHESTRATOR_CONCURRENCY,
            relay: RelayConfig::default(),
            compensation_retry: None,
            delivery_timeout: None,
            metrics: None,
            max_in_flight: Some(agentsaga_saga::DEFAULT_MAX_IN_FLIGHT),
            max_in_flight_for: Vec::new(),
            retention: crate::Retention::default(),
            rate_limits: std::collections::HashMap::new(),
            stall_watch: crate::stalled::StallWatch::default(),
            answers_in_agent_tx: true,
            faults: Arc::default(),
            #[cfg(feature = "nats")]
            nats: None,
            #[cfg(feature = "nats")]
            remote: Vec::new(),
        }
    }

    /// Serves Prometheus metrics at `http://<addr>/metrics` (see [`crate::metrics`]).
    /// Use a loopback address unless the network is yours; port 0 picks a free one.
    pub fn metrics(mut self, addr: std::net::SocketAddr) -> Self {
        self.metrics = Some(addr);
        self
    }

    /// The database: `sqlite://file.db`, `sqlite::memory:`, or `postgres://…`
    /// (default [`DEFAULT_DATABASE`], a SQLite file in the working directory).
    pub fn database(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// An already-open store instead of a URL.
    pub fn store(mut self, store: Store) -> Self {
        self.store = Some(store);
        self
    }

    /// How the store is opened (when given a URL).
    pub fn store_config(mut self, config: StoreConfig) -> Self {
        self.store_config = config;
        self
    }

    /// Hosts an agent that only writes to the database: this process consumes its
    /// destination, [`agent_concurrency`](Self::agent_concurrency) deliveries at once.
    pub fn agent<A: Agent>(mut self, agent: A) -> Self {
        self.agents.push(Arc::new(Local(agent)));
        self
    }

    /// Hosts an agent that waits on the outside world: this process consumes its
    /// destination, [`calling_concurrency`](Self::calling_concurrency) deliveries at
    /// once, with no transaction held while they wait.
    pub fn calling_agent<A: CallingAgent>(mut self, agent: A) -> Self {
        self.agents.push(Arc::new(Calling(agent)));
        self
    }

    /// Calls of `destination` (consumed by a [`CallingAgent`](crate::CallingAgent)
    /// of this runtime) keep to `limit`, together with every other process of the
    /// database that declares it: give each the same limit.
    pub fn rate_limit(mut self, destination: impl Into<String>, limit: crate::RateLimit) -> Self {
        self.rate_limits.insert(destination.into(), limit);
        self
    }

    /// Registers a saga definition: this process starts its instances and consumes its
    /// orchestrator destination. Register several versions of one saga side by side.
    pub fn saga(mut self, definition: SagaDefinition) -> Self {
        self.sagas.push(definition);
        self
    }

    /// [`metrics`](Self::metrics) if `addr` is `Some`.
    pub fn maybe_metrics(mut self, addr: Option<std::net::SocketAddr>) -> Self {
        self.metrics = addr;
        self
    }

    /// Deliveries each database-only [`Agent`] handles at once (default
    /// [`DEFAULT_AGENT_CONCURRENCY`]): each handler runs in its turn of a shared
    /// transaction (group commit), holding it while it runs; more at once means more
    /// hops per commit (and on PostgreSQL per statement of the set lane), not more
    /// handlers running in parallel.
    pub fn agent_concurrency(mut self, n: usize) -> Self {
        self.agent_concurrency = n.max(1);
        self
    }

    /// Deliveries each [`CallingAgent`] works on at once (default
    /// [`DEFAULT_CALLING_CONCURRENCY`]): waiting holds no database, so hundreds are
    /// fine. Memory is bounded by it: the relay claims no more for the agent than it
    /// can take (plus at most one claim batch).
    pub fn calling_concurrency(mut self, n: usize) -> Self {
        self.calling_concurrency = n.max(1);
        self
    }

    /// Deliveries the agent of `destination` handles at once, overriding
    /// [`agent_concurrency`](Self::agent_concurrency) or
    /// [`calling_concurrency`](Self::calling_concurrency) for it alone.
    pub fn concurrency(mut self, destination: impl Into<String>, n: usize) -> Self {
        self.concurrency.insert(destination.into(), n.max(1));
        self
    }

    /// Deliveries each saga version's orchestrator handles at once (default
    /// [`DEFAULT_ORCHESTRATOR_CONCURRENCY`]).
    pub fn orchestrator_concurrency(mut self, n: usize) -> Self {
        self.orchestrator_concurrency = n.max(1);
        self
    }

    /// Whether an agent's answer (its reply, or its timeout notice) to a saga run by
    /// this process is applied to the saga in the agent's own transaction (default
    /// `true`): the agent's effects, its inbox record, the step's outcome and the
    /// saga's next messages commit together, and the answer is never an outbox row,
    /// a delivery or an orchestrator inbox record. `false` sends every answer through
    /// the outbox, one hop more per step (see `docs/ARCHITECTURE.md`). A redelivered
    /// command, or an answer for a saga version not registered here, always goes
    /// through the outbox.
    pub fn answers_in_agent_transaction(mut self, on: bool) -> Self {
        self.answers_in_agent_tx = on;
        self
    }

    /// The relay's configuration (batch size, workers, lease, retry policy...).
    pub fn relay_config(mut self, config: RelayConfig) -> Self {
        self.relay = config;
        self
    }

    /// Admission control: at most `bound` sagas of each name in flight (running or
    /// compensating) at once, by default [`agentsaga_saga::DEFAULT_MAX_IN_FLIGHT`].
    /// Starts beyond it wait, durably and in order (`saga_starts`), and start as
    /// sagas finish: [`Runtime::start_saga`] waits for its turn, `try_start_saga`
    /// answers busy, [`Runtime::start_saga_in`] is accepted in the caller's
    /// transaction. `None` admits everything at once.
    pub fn max_sagas_in_flight(mut self, bound: Option<usize>) -> Self {
        self.max_in_flight = bound;
        self
    }

    /// [`max_sagas_in_flight`](Self::max_sagas_in_flight) for saga `name` alone.
    pub fn max_in_flight_for(mut self, name: impl Into<String>, bound: Option<usize>) -> Self {
        self.max_in_flight_for.push((name.into(), bound));
        self
    }

    /// What the runtime prunes, how old, how often (default [`crate::Retention`]:
    /// delivered outbox rows after an hour, inbox records after 7 days, finished sagas
    /// kept; [`crate::Retention::off`] keeps everything).
    pub fn retention(mut self, retention: crate::Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Stalled sagas (running or compensating, not waiting for a signal, with nothing
    /// pending or in flight for them, or no progress for `threshold`; default 15
    /// minutes) are looked for every `every` (default 30 s): each is logged once, as a
    /// warning, and counted in the `agentsaga_sagas_stalled` gauge.
    pub fn stalled_after(mut self, threshold: Duration, every: Duration) -> Self {
        self.stall_watch = crate::stalled::StallWatch {
            threshold,
            every: every.max(Duration::from_millis(10)),
        };
        self
    }

    /// How failed compensations are retried before the saga is stuck.
    pub fn compensation_retry(mut self, policy: RetryPolicy) -> Self {
        self.compensation_retry = Some(policy);
        self
    }

    /// An upper bound on any one delivery to an actor of this process, past which it
    /// counts as failed and is retried. None by default: a handler runs as long as it
    /// needs (the relay renews its message's lease), bounded by its saga step's
    /// `timeout`, which cancels it.
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = Some(timeout);
        self
    }

    /// Opens the store (migrating it), spawns the actors and starts the relay. Sagas
    /// left unfinished by an earlier process resume by themselves: their next messages
    /// are in the outbox.
    ///
    /// # Errors
    /// [`Error::Config`] with nothing to host; store, engine and relay errors.
    pub async fn start(self) -> Result<Runtime> {
        if let Some(inbox) = self.retention.inbox {
            let window = crate::retention::redelivery_window(&self.relay);
            if inbox < window {
                return Err(Error::Config(format!(
                    "inbox retention {inbox:?} is shorter than the redelivery window {window:?} \
                     (a lease per attempt plus the retry backoff): a late duplicate would be \
                     processed again"
                )));
            }
        }
        let calling = self.agents.iter().filter(|a| a.calls_out());
        crate::rate_limit::check(&self.rate_limits, calling.map(|a| a.destination()))?;
        let mut engine = Engine::new(self.sagas)?.with_max_in_flight(self.max_in_flight);
        for (name, bound) in self.max_in_flight_for {
            if !engine.definitions().any(|d| d.name() == name) {
                return Err(Error::Config(format!(
                    "max_in_flight_for `{name}`, which is not a registered saga"
                )));
            }
            engine = engine.with_max_in_flight_for(name, bound);
        }
        if let Some(p) = self.compensation_retry {
            engine = engine.with_compensation_retry(p);
        }
        let destinations = super::destinations::hosted(&self.agents, &self.concurrency, &engine)?;
        #[cfg(feature = "nats")]
        super::destinations::check_remote(&self.remote, &destinations, self.nats.as_ref())?;
        // Only a configuration that can run opens (and may create) its database.
        let (store, sqlite_lock) = crate::single::open(
            self.store,
            self.url.as_deref().unwrap_or(DEFAULT_DATABASE),
            self.store_config,
        )
        .await?;
        let (settled, _) = broadcast::channel(1024);
        let sagas =
            (self.answers_in_agent_tx && engine.definitions().next().is_some()).then(|| {
                Arc::new(crate::actors::Orchestrator {
                    engine: engine.clone(),
                    store: store.clone(),
                    settled: settled.clone(),
                })
            });
        let faults = self.faults;
        let mut specs = Vec::new();
        let mut relay = self.relay;
        let mut total = 0;
        for agent in &self.agents {
            let destination = agent.destination();
            let concurrency =
                self.concurrency
                    .get(destination)
                    .copied()
                    .unwrap_or(if agent.calls_out() {
                        self.calling_concurrency
                    } else {
                        self.agent_concurrency
                    });
            // The relay claims no more for an agent than it can take at once, so a
            // backlog stays in the outbox, not in memory.
            relay
                .destination_limits
                .entry(destination.to_owned())
                .or_insert(concurrency);
            total += concurrency;
            specs.push(ChildSpec::Agent {
                agent: Arc::clone(agent),
                store: store.clone(),
                concurrency,
                limit: self.rate_limits.get(destination).copied(),
                sagas: sagas.clone(),
                faults: Arc::clone(&faults),
            });
        }
        for destination in engine.orchestrator_destinations() {
            total += self.orchestrator_concurrency;
            specs.push(ChildSpec::Orchestrator {
                destination: destination.clone(),
                concurrency: self.orchestrator_concurrency,
                engine: engine.clone(),
                store: store.clone(),
                settled: settled.clone(),
            });
        }
        // A relay delivery waits for its answer: enough workers to keep every actor
        // of this process busy at once.
        relay.workers = relay.workers.max(total);
        // Every destination of this relay is served here: a message for one goes from
        // the transaction that writes it straight to its actor (the claim stays the
        // safety net: after a crash, or past a destination's cap).
        relay.handover = true;
        let transport = match self.delivery_timeout {
            Some(t) => InProcessTransport::new().timeout(t),
            None => InProcessTransport::new(),
        };
        // The link first: if the broker cannot be reached, nothing else has started.
        #[cfg(feature = "nats")]
        let linked = match &self.nats {
            Some(link) => Some(
                crate::remote::Linked::start(&store, link, &destinations, &self.remote, &relay)
                    .await?,
            ),
            None => None,
        };
        let (supervisor, _) = Actor::spawn(
            None,
            Supervisor {
                transport: transport.clone(),
            },
            specs,
        )
        .await
        .map_err(|e| Error::Spawn(e.to_string()))?;
        let relay = Relay::start(
            store.clone(),
            destinations.clone(),
            Arc::new(transport),
            relay,
        )
        .await?;
        let (metrics, sampler) = match self.metrics {
            Some(addr) => {
                let endpoint = crate::metrics::serve(addr)
                    .await
                    .map_err(|e| Error::Config(format!("metrics endpoint on {addr}: {e}")))?;
                let sampler = crate::metrics::sampler(
                    store.clone(),
                    {
                        let read = relay.stats_reader();
                        move || Some(read())
                    },
                    Duration::from_secs(1),
                );
                (Some(endpoint), Some(sampler))
            }
            None => (None, None),
        };
        let pruner = crate::retention::spawn(store.clone(), self.retention);
        let stall_watch = crate::stalled::spawn(store.clone(), self.stall_watch);
        let admission =
            crate::admission::Admission::spawn(store.clone(), engine.clone(), settled.subscribe());
        super::report_unregistered(&store, &engine).await;
        tracing::info!(destinations = ?destinations, backend = store.backend(), "agentsaga runtime started");
        let counts = crate::counts::spawn(store.clone());
        let schedules = admission.schedules(store.clone(), engine.clone());
        let firing = crate::schedules::spawn(schedules.clone());
        Ok(Runtime {
            store,
            engine,
            relay: Some(relay),
            supervisor,
            settled,
            metrics,
            sampler,
            admission,
            pruner,
            stall_watch: Some(stall_watch),
            counts,
            schedules,
            firing,
            stalled_after: self.stall_watch.threshold,
            _sqlite_lock: sqlite_lock,
            faults,
            #[cfg(feature = "nats")]
            linked,
        })
    }
}
