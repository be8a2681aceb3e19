//! (feature `testing`) Sagas under test in milliseconds: [`TestRuntime`] runs the real
//! runtime (your agents, your sagas, the real engine, relay and store) on a fresh SQLite
//! file, or a PostgreSQL database of the test's own ([`TestRuntime::start_on`]), whose
//! clock is a [`ManualClock`], and moves that clock for you.
//!
//! ```no_run
//! # use std::time::Duration;
//! # use agentsaga_runtime::{Runtime, testing::TestRuntime};
//! # use agentsaga_saga::{Saga, SagaState, Step};
//! # async fn demo() -> agentsaga_runtime::Result<()> {
//! let follow_up = Saga::<serde_json::Value>::builder("follow_up", 1)
//!     .step(Step::sleep("nap", Duration::from_secs(3 * 86_400)))
//!     .pivot(Step::new("mail", "mailer"))
//!     .build()?;
//! let t = TestRuntime::start(Runtime::builder().saga(follow_up) /* .agent(…) */).await?;
//! let id = t.start_saga("follow_up", &serde_json::json!({})).await?;
//! // Runs what is due, skips the clock to the next timer (the three days), runs again:
//! assert_eq!(t.run_to_end(id).await?, SagaState::Completed);
//! # Ok(()) }
//! ```
//!
//! What "at rest" means ([`TestRuntime::run_until_idle`]): no message in flight and none
//! due by the clock, read in one snapshot of the database, twice in a row. A delivery
//! in flight is an agent at work, so time is never skipped under it: an agent call
//! that waits forever (to test a step's timeout) is timed out by moving the clock
//! yourself ([`TestRuntime::advance`]), not by [`run_to_end`](TestRuntime::run_to_end).
//! Mocks of outside calls should answer without waiting real time.

use std::time::Duration;

use agentsaga_core::Sql;
use agentsaga_core::clock::ManualClock;
use agentsaga_saga::query;
use agentsaga_saga::{SagaId, SagaState};

mod host;
mod lifecycle;
mod promises;
mod recording;
mod rest;
mod trace;

pub use crate::faults::{Action, Entry, Fault};
use crate::{Error, Result, Runtime};
pub use promises::{RandomFaults, Report, SEED_VAR, seeds};
pub use recording::{RECORD_VAR, Recorded, Recording};
pub use trace::{Span, Trace};

/// Where a [`TestRuntime`]'s clock starts unless told: 2030-01-01T00:00:00Z, a fixed
/// time, so that what a test sees does not depend on the day it runs.
pub const START_MS: i64 = 1_893_456_000_000;

/// How long (real time) [`TestRuntime::run_until_idle`] waits by default for the
/// runtime to come to rest before it reports what is still going on
/// ([`TestRuntime::set_patience`]).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// How long (real time) [`TestRuntime::advance`] waits for what is due at its call to
/// run before its first move of the clock.
pub const FIRST_MOVE_PATIENCE: Duration = Duration::from_millis(250);

/// At most this many moves of the clock in one [`TestRuntime::run_to_end`].
pub const MAX_SKIPS: usize = 10_000;

/// The real runtime on a fresh database, on a clock that moves only when the test
/// (or [`run_to_end`](Self::run_to_end)) moves it. Derefs to the [`Runtime`].
pub struct TestRuntime {
    runtime: Runtime,
    clock: ManualClock,
    /// Its database: the same one after a [`restart`](Self::restart).
    url: String,
    patience: Duration,
    /// The tokio runtime the runtime's tasks run on (after `runtime`: dropped last).
    host: host::Host,
    /// What its threads traced.
    tracing: std::sync::Arc<trace::Tracing>,
}

impl std::ops::Deref for TestRuntime {
    type Target = Runtime;
    fn deref(&self) -> &Runtime {
        &self.runtime
    }
}

impl TestRuntime {
    /// How long (real time) [`run_until_idle`](Self::run_until_idle) waits for rest
    /// (default [`PATIENCE`]).
    pub fn set_patience(&mut self, patience: Duration) {
        self.patience = patience;
    }

    /// The runtime under test.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Its clock. Move it with [`advance`](Self::advance) (or the store's
    /// `advance_clock`, which moves a PostgreSQL database's clock with it).
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// The clock's now, in Unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Saga `id`'s state.
    ///
    /// # Errors
    /// A store error; [`agentsaga_saga::Error::NotFound`] for no such saga.
    pub async fn state(&self, id: SagaId) -> Result<SagaState> {
        match query::get(self.runtime.store(), id).await? {
            Some(s) => Ok(s.state),
            None => Err(Error::Saga(agentsaga_saga::Error::NotFound(id))),
        }
    }

    /// How many messages `destination` has handled, e.g. `calls("payments")`: its
    /// inbox records, so each command, each retry of it (a message of its own) and
    /// each compensation once, whatever its outcome; a redelivery is not counted
    /// again.
    ///
    /// # Errors
    /// A store error.
    pub async fn calls(&self, destination: &str) -> Result<u64> {
        let row = Sql::new("SELECT count(*) AS n FROM inbox WHERE consumer = ?")
            .bind(destination)
            .fetch_one(self.runtime.store().reader())
            .await?;
        Ok(u64::try_from(row.int("n")?).unwrap_or(0))
    }

    /// The next `n` deliveries to `destination` do `fault` instead of reaching its
    /// agent (after the faults already waiting there): answered as the agent's failure
    /// would be, in a hop of their own (the inbox records them), so the saga sees what
    /// a failing agent sends. Counted by [`calls`](Self::calls); the agent itself is
    /// not called.
    pub fn fail_next(&self, destination: &str, n: usize, fault: &Fault) {
        self.runtime.faults.push(destination, n, fault);
    }

    /// [`Runtime::start_saga`], its `saga.start` span traced with the runtime's
    /// ([`trace`](Self::trace)).
    ///
    /// # Errors
    /// As [`Runtime::start_saga`].
    pub async fn start_saga<D: serde::Serialize>(&self, name: &str, data: &D) -> Result<SagaId> {
        use tracing::instrument::WithSubscriber as _;
        let dispatch = self.tracing.dispatch.clone();
        let start = self
            .runtime
            .start_saga(name, data)
            .with_subscriber(dispatch);
        self.unless_crashed(start).await
    }

    /// [`Runtime::start_saga_with_key`], traced as [`start_saga`](Self::start_saga).
    ///
    /// # Errors
    /// As [`Runtime::start_saga_with_key`].
    pub async fn start_saga_with_key<D: serde::Serialize>(
        &self,
        name: &str,
        key: &str,
        data: &D,
    ) -> Result<SagaId> {
        use tracing::instrument::WithSubscriber as _;
        let dispatch = self.tracing.dispatch.clone();
        let start = self
            .runtime
            .start_saga_with_key(name, key, data)
            .with_subscriber(dispatch);
        self.unless_crashed(start).await
    }

    /// [`Runtime::signal`], as the person (or system) the wait waits for would send
    /// it: traced as [`start_saga`](Self::start_saga), and failing if the runtime
    /// crashes while the signal waits on its commit.
    ///
    /// # Errors
    /// As [`Runtime::signal`].
    pub async fn signal(
        &self,
        id: SagaId,
        name: &str,
        signal: agentsaga_saga::Signal,
    ) -> Result<agentsaga_saga::SignalReceipt> {
        use tracing::instrument::WithSubscriber as _;
        let dispatch = self.tracing.dispatch.clone();
        let sent = self
            .runtime
            .signal(id, name, signal)
            .with_subscriber(dispatch);
        self.unless_crashed(sent).await
    }

    /// Saga `id`'s trace: the finished spans of the one trace its spans are in, rooted
    /// at its `saga.start` (a child saga's spans are in its parent's trace). The
    /// runtime's threads trace to an in-memory exporter of this test runtime's own, as
    /// `telemetry::init` would export them; set `RUST_LOG` to see its logs too.
    ///
    /// # Errors
    /// [`Error::PromiseBroken`] if the saga's spans are in more than one trace, or it
    /// has none.
    pub fn trace(&self, id: SagaId) -> Result<Trace> {
        self.tracing.trace(id)
    }

    /// Cuts the link to `destination`, as a broker outage or a network partition
    /// would: every delivery to it is answered "unavailable" without reaching its
    /// agent, so the relay keeps its messages pending (no attempt spent, nothing
    /// dead-lettered however long the cut; its circuit breaker opens and probes), and
    /// its sagas wait. [`mend_link`](Self::mend_link) ends the cut.
    pub fn cut_link(&self, destination: &str) {
        self.runtime.faults.cut(destination, true);
    }

    /// Ends the cut of [`cut_link`](Self::cut_link): deliveries reach `destination`
    /// again (once its circuit breaker's probe goes through).
    pub fn mend_link(&self, destination: &str) {
        self.runtime.faults.cut(destination, false);
    }

    /// From now on, each delivery of a saga's command or compensation draws a fault
    /// (a [`Fault`] of any kind) with probability `rate` (0 to 1), from `seed`: the
    /// `n`-th delivery of a step's command (or compensation) in a saga draws the same
    /// fault for the same seed, so with agents that answer alike a seed replays its
    /// saga's path. After the faults [`fail_next`](Self::fail_next) queued.
    /// [`check_promises`](Self::check_promises) then tells whether the saga kept its
    /// promises; [`RandomFaults`] does both over many seeds.
    pub fn random_faults(&self, seed: u64, rate: f64) {
        self.runtime
            .faults
            .randomly(crate::faults::Chaos::new(seed, rate));
    }

    /// The faults [`random_faults`](Self::random_faults) drew so far, by kind
    /// (`retryable`, `fatal`, `timed out`, `dead letter`, `twice`).
    pub fn faults_drawn(&self) -> Vec<(String, u64)> {
        self.runtime.faults.drawn()
    }

    /// Saga `id`'s ledger as it happened: each step's command done and each
    /// compensation done (undone), in the order their agents' transactions committed.
    /// A delivery that failed, timed out, was faulted or was a duplicate the inbox
    /// skipped is not in it: only effects that count.
    pub fn ledger(&self, id: SagaId) -> Vec<Entry> {
        self.runtime.faults.journal.of(id)
    }

    /// How many times `destination`'s agent committed its effects (its work succeeded
    /// and its transaction committed), a saga's or not: the number a test asserts as
    /// "charged once". [`calls`](Self::calls) counts every message it handled,
    /// failures included.
    pub fn effects(&self, destination: &str) -> u64 {
        self.runtime.faults.journal.at(destination)
    }
}
