//! The runtime: a store, the agents and sagas this process hosts, their actors, and a
//! relay delivering their messages.

use std::time::Duration;

use agentsaga_core::{Store, Tx};
use agentsaga_relay::Relay;
use agentsaga_saga::{Accepted, Engine, SagaId, SagaState, Signal, SignalReceipt, query};
use ractor::ActorRef;
use serde::Serialize;
use tokio::sync::broadcast;

use crate::Result;
use crate::actors::Settled;
use crate::supervisor::SupervisorMsg;

mod builder;
mod destinations;
#[cfg(feature = "nats")]
mod linking;
#[cfg(feature = "testing")]
mod under_test;

pub use builder::{
    DEFAULT_AGENT_CONCURRENCY, DEFAULT_CALLING_CONCURRENCY, DEFAULT_DATABASE,
    DEFAULT_ORCHESTRATOR_CONCURRENCY, RuntimeBuilder,
};

/// A running agentsaga process: hosts agents and sagas, delivers their messages.
pub struct Runtime {
    store: Store,
    engine: Engine,
    pub(crate) relay: Option<Relay>,
    supervisor: ActorRef<SupervisorMsg>,
    settled: broadcast::Sender<Settled>,
    metrics: Option<crate::metrics::MetricsEndpoint>,
    sampler: Option<tokio::task::JoinHandle<()>>,
    admission: crate::admission::Admission,
    pruner: Option<tokio::task::JoinHandle<()>>,
    stall_watch: Option<tokio::task::JoinHandle<()>>,
    /// Folds the finished sagas' count deltas (PostgreSQL only).
    counts: Option<tokio::task::JoinHandle<()>>,
    /// The schedules' handle, and the task that fires them.
    schedules: crate::Schedules,
    firing: Option<tokio::task::JoinHandle<()>>,
    /// The stall watch's threshold, which the admin router's console uses too.
    #[cfg_attr(not(feature = "console"), allow(dead_code))]
    stalled_after: Duration,
    /// This runtime's hold on its SQLite file (see [`single`](crate::single)).
    _sqlite_lock: Option<crate::single::SqliteLock>,
    /// A test's faults for its agents (feature `testing`).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) faults: std::sync::Arc<crate::faults::Faults>,
    /// What it runs for its NATS link, if any.
    #[cfg(feature = "nats")]
    linked: Option<crate::remote::Linked>,
}

impl Runtime {
    /// A builder with defaults: 4 deliveries at once per database-only agent and per
    /// saga version, 512 per calling agent, the default relay configuration (with
    /// workers enough for all of them).
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::new()
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The saga engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The schedules of this runtime's database: sagas started on a calendar (see
    /// [`agentsaga_saga::schedule`]). This runtime fires the due ones of its sagas.
    pub fn schedules(&self) -> &crate::Schedules {
        &self.schedules
    }

    /// The operator console over this runtime's store and sagas, as an axum 0.8
    /// router: the admin HTTP API under `/api/v1` and the web page at `/`, behind
    /// `config`'s tokens (see [`agentsaga_console::http`]). Serve it, or merge it into
    /// your own axum app (`app.merge(runtime.admin_router(config))`). Unlike
    /// `agentsaga serve`, it has the runtime's definitions: `POST /api/v1/sagas` starts
    /// this runtime's sagas and `retry` can re-send a step after the pivot; stalled
    /// sagas are counted with [`RuntimeBuilder::stalled_after`]'s threshold. With a
    /// NATS link (feature `nats`), it shows the destinations the runtime sends to other
    /// services and those it hosts with the broker's figures (`GET /api/v1/remote`).
    ///
    /// With no token in `config` every request is served: bind it to a loopback
    /// address only.
    #[cfg(feature = "console")]
    pub fn admin_router(&self, config: agentsaga_console::http::HttpConfig) -> axum::Router {
        let console = agentsaga_console::Console::new(self.store.clone())
            .with_engine(self.engine.clone())
            .stalled_after(self.stalled_after);
        // A linked runtime's console shows the broker's side of its destinations too.
        #[cfg(feature = "nats")]
        let console = match &self.linked {
            Some(linked) => console.with_remote(linked.source()),
            None => console,
        };
        agentsaga_console::http::router(console, config)
    }

    /// Where metrics are served, if they are.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics
            .as_ref()
            .map(crate::metrics::MetricsEndpoint::addr)
    }

    /// Samples the database and the relay into the metrics now (the runtime also does
    /// it every second).
    pub async fn sample_metrics(&self) {
        let relay = self.relay_stats();
        crate::metrics::sample(&self.store, &|| relay.clone()).await;
    }

    /// The relay's counters.
    pub fn relay_stats(&self) -> Option<agentsaga_relay::RelayStats> {
        self.relay.as_ref().map(Relay::stats)
    }

    /// Starts saga `name` with `data` in a transaction of its own; returns its id once
    /// the saga has started. While its saga name is at its admission bound
    /// ([`RuntimeBuilder::max_sagas_in_flight`]) the start is stored and this waits
    /// for its turn: the caller feels backpressure, and a crash meanwhile loses nothing
    /// (the stored start is started by the next process).
    ///
    /// # Errors
    /// [`agentsaga_saga::Error::UnknownSaga`] (as [`Error::Saga`](crate::Error::Saga)) for an unregistered
    /// name; [`agentsaga_saga::Error::Data`] for data that does not decode as the
    /// saga's input, and [`agentsaga_core::Error::PayloadTooLarge`] (as
    /// [`agentsaga_saga::Error::Store`]) for a first command over the message size
    /// limit — checked before anything is written, also for a start that would wait;
    /// [`agentsaga_saga::Error::StartSetAside`] if a start that waited could not be
    /// started when its turn came (it is set aside, see `agentsaga starts list`);
    /// store errors.
    pub async fn start_saga<D: Serialize>(&self, name: &str, data: &D) -> Result<SagaId> {
        self.start_keyed(name, None, data).await
    }

    /// [`start_saga`](Self::start_saga) with the caller's idempotency key (an order
    /// id, a request id): the first start of `name` with `key` starts the saga, and
    /// every later one (a retried request, a second process racing the first) starts
    /// nothing and returns the first saga's id, whatever that saga's state. The key
    /// is kept with the saga (`agentsaga sagas list --key K`) until retention prunes
    /// the finished saga.
    ///
    /// # Errors
    /// [`agentsaga_saga::Error::InvalidKey`] for an empty key or one longer than
    /// [`agentsaga_saga::MAX_KEY_BYTES`]; as [`start_saga`](Self::start_saga).
    pub async fn start_saga_with_key<D: Serialize>(
        &self,
        name: &str,
        key: &str,
        data: &D,
    ) -> Result<SagaId> {
        self.start_keyed(name, Some(key), data).await
    }

    async fn start_keyed<D: Serialize>(
        &self,
        name: &str,
        key: Option<&str>,
        data: &D,
    ) -> Result<SagaId> {
        let data = serde_json::to_value(data).map_err(agentsaga_saga::Error::from)?;
        let mut tx = self.store.begin().await?;
        let accepted = self.engine.accept_keyed(&mut tx, name, key, data).await?;
        tx.commit().await?;
        match accepted {
            Accepted::Started(id) => Ok(id),
            Accepted::Waiting(id) => {
                self.admission.poke();
                self.admission.started(&self.store, id).await?;
                Ok(id)
            }
            Accepted::Existing(id) => {
                // Started, or waiting its turn, or set aside: as for the first start.
                self.admission.started(&self.store, id).await?;
                Ok(id)
            }
        }
    }

    /// Starts saga `name` now if its admission bound has room; otherwise writes
    /// nothing and answers [`agentsaga_saga::Error::Busy`] (as [`Error::Saga`](crate::Error::Saga); see
    /// [`Error::is_busy`](crate::Error::is_busy)).
    ///
    /// # Errors
    /// Busy; as [`start_saga`](Self::start_saga).
    pub async fn try_start_saga<D: Serialize>(&self, name: &str, data: &D) -> Result<SagaId> {
        let data = serde_json::to_value(data).map_err(agentsaga_saga::Error::from)?;
        let mut tx = self.store.begin().await?;
        let id = self.engine.try_start_json(&mut tx, name, data).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Starts saga `name` inside the caller's transaction, beside its own changes: the
    /// saga exists exactly when that transaction commits. Beyond the admission bound
    /// the start is stored in that transaction and started, in order, when there is
    /// room: it is never refused or dropped. [`wait`](Self::wait) works on its id
    /// either way.
    ///
    /// # Errors
    /// As [`start_saga`](Self::start_saga).
    pub async fn start_saga_in<D: Serialize>(
        &self,
        tx: &mut Tx,
        name: &str,
        data: &D,
    ) -> Result<SagaId> {
        self.start_in_keyed(tx, name, None, data).await
    }

    /// Starts a saga `name` for each of `data`, inside the caller's transaction, as
    /// that many [`start_saga_in`](Self::start_saga_in)s would (beyond the admission
    /// bound the rest wait, in order), but in a few statements for the lot rather
    /// than a few per saga: the way to start a batch. The ids come in the order of
    /// `data`.
    ///
    /// # Errors
    /// As [`start_saga`](Self::start_saga); a `data` that does not serialize or fails
    /// its saga's checks fails the call before anything is written.
    pub async fn start_sagas_in<D: Serialize>(
        &self,
        tx: &mut Tx,
        name: &str,
        data: &[D],
    ) -> Result<Vec<SagaId>> {
        let data = data
            .iter()
            .map(serde_json::to_value)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(agentsaga_saga::Error::from)?;
        let accepted = self.engine.accept_many(tx, name, data).await?;
        if accepted.iter().any(|a| matches!(a, Accepted::Waiting(_))) {
            self.admission.poke();
        }
        Ok(accepted.into_iter().map(Accepted::id).collect())
    }

    /// [`start_saga_in`](Self::start_saga_in) with the caller's idempotency key, as
    /// [`start_saga_with_key`](Self::start_saga_with_key): inside the caller's
    /// transaction, a key already taken (committed, or by a transaction that commits
    /// while this one waits for it) starts nothing and returns the first saga's id.
    ///
    /// # Errors
    /// As [`start_saga_with_key`](Self::start_saga_with_key).
    pub async fn start_saga_in_with_key<D: Serialize>(
        &self,
        tx: &mut Tx,
        name: &str,
        key: &str,
        data: &D,
    ) -> Result<SagaId> {
        self.start_in_keyed(tx, name, Some(key), data).await
    }

    async fn start_in_keyed<D: Serialize>(
        &self,
        tx: &mut Tx,
        name: &str,
        key: Option<&str>,
        data: &D,
    ) -> Result<SagaId> {
        let data = serde_json::to_value(data).map_err(agentsaga_saga::Error::from)?;
        let accepted = self.engine.accept_keyed(tx, name, key, data).await?;
        if let Accepted::Waiting(_) = accepted {
            self.admission.poke();
        }
        Ok(accepted.id())
    }

    /// Sends signal `name` to saga `id` (a person's approval, an outside event) in a
    /// transaction of its own. A saga parked at `Step::wait_for(name)` goes on; one
    /// that has not reached that wait yet uses the signal when it does; a second signal
    /// for the same wait changes nothing ([`SignalReceipt::Duplicate`]).
    ///
    /// # Errors
    /// [`agentsaga_saga::Error::NotFound`] for an unknown saga,
    /// [`agentsaga_saga::Error::SignalRefused`] for a finished saga or a name it never
    /// waits for (as [`Error::Saga`](crate::Error::Saga); nothing written); store errors.
    pub async fn signal(&self, id: SagaId, name: &str, signal: Signal) -> Result<SignalReceipt> {
        let mut tx = self.store.begin().await?;
        let receipt = Engine::signal(&mut tx, id, name, signal).await?;
        tx.commit().await?;
        Ok(receipt)
    }

    /// [`signal`](Self::signal) inside the caller's transaction: the signal exists
    /// exactly when that transaction commits.
    ///
    /// # Errors
    /// As [`signal`](Self::signal).
    pub async fn signal_in(
        &self,
        tx: &mut Tx,
        id: SagaId,
        name: &str,
        signal: Signal,
    ) -> Result<SignalReceipt> {
        Ok(Engine::signal(tx, id, name, signal).await?)
    }

    /// Waits until saga `id` is completed, compensated, aborted or stuck, and returns
    /// that state. Works for sagas advanced by other processes too (it also polls).
    ///
    /// # Errors
    /// [`agentsaga_saga::Error::NotFound`] for an unknown id; store errors.
    pub async fn wait(&self, id: SagaId) -> Result<SagaState> {
        let mut rx = self.settled.subscribe();
        loop {
            match query::get(&self.store, id).await? {
                Some(s) if s.state.is_terminal() || s.state == SagaState::Stuck => {
                    return Ok(s.state);
                }
                Some(_) => {}
                // Admission moves a start to `saga_instances` in one transaction: ask
                // the queue first, then the instances again, so the move is not missed.
                None if Engine::is_waiting(&self.store, id).await? => {}
                None if query::get(&self.store, id).await?.is_some() => continue,
                None => {
                    return Err(crate::admission::not_started(&self.store, id).await);
                }
            }
            let deadline = tokio::time::sleep(Duration::from_millis(500));
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    () = &mut deadline => break,
                    ev = rx.recv() => match ev {
                        Ok(ev) if ev.saga == id => return Ok(ev.state),
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Lagged(_)) => break,
                        Err(broadcast::error::RecvError::Closed) => break,
                    },
                }
            }
        }
    }

    /// Stops gracefully: the relay stops claiming and finishes or releases what it has
    /// in flight, then the actors stop. Nothing is lost: what was not delivered is
    /// delivered by the next process.
    pub async fn shutdown(mut self) {
        if let Some(sampler) = self.sampler.take() {
            sampler.abort();
        }
        self.admission.stop();
        if let Some(watch) = self.stall_watch.take() {
            watch.abort();
        }
        if let Some(counts) = self.counts.take() {
            counts.abort();
        }
        if let Some(firing) = self.firing.take() {
            firing.abort();
        }
        if let Some(pruner) = self.pruner.take() {
            pruner.abort();
        }
        self.metrics.take();
        // Nothing more taken from the broker, then nothing more published to it.
        #[cfg(feature = "nats")]
        if let Some(linked) = self.linked.take() {
            linked.stop().await;
        }
        if let Some(relay) = self.relay.take() {
            relay.shutdown().await;
        }
        // Acknowledged before any child is stopped: a child's end seen before the
        // supervisor knew it was on purpose was logged as a death and restarted.
        let _ = ractor::call!(self.supervisor, SupervisorMsg::Quiesce);
        let cell = self.supervisor.get_cell();
        cell.stop_children_and_wait(None, Some(Duration::from_secs(10)))
            .await;
        let _ = cell.stop_and_wait(None, Some(Duration::from_secs(5))).await;
        self.store.close().await;
    }
}

async fn report_unregistered(store: &Store, engine: &Engine) {
    match query::unfinished(store).await {
        Ok(list) => {
            for s in list.iter().filter(|s| !engine.has(&s.name, s.version)) {
                tracing::warn!(saga.id = %s.id, saga.name = %s.name, version = s.version,
                    "unfinished saga of a version this process does not register: left for a process that has it");
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not list unfinished sagas"),
    }
}
