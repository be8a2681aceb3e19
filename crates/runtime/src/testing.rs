//! (feature `testing`) Sagas under test in milliseconds: [`TestRuntime`] runs the real
//! runtime (your agents, your sagas, the real engine, relay and store) on a fresh SQLite
//! file whose clock is a [`ManualClock`], and moves that clock for you.
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
mod trace;

pub use crate::faults::{Action, Entry, Fault};
use crate::{Error, Result, Runtime};
pub use promises::{RandomFaults, Report, SEED_VAR};
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

/// The real runtime on a fresh SQLite file, on a clock that moves only when the test
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

    /// Its clock.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// The clock's now, in Unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Lets `d` of clock time pass, as it would pass for real: the clock moves from
    /// timer to timer (a retry's backoff, a sleep's end, a timeout, a schedule's slot)
    /// up to `d`, and what falls due at each runs before it moves on (a retry that
    /// falls due again within `d` runs again). When it returns, the clock stands `d`
    /// later and the runtime is at rest. What is due when it is called runs first; an
    /// agent still at work after [`FIRST_MOVE_PATIENCE`] keeps its work, and the clock
    /// moves under it (so that a step's timeout can be passed under an agent that
    /// never answers).
    ///
    /// # Errors
    /// As [`run_until_idle`](Self::run_until_idle); [`Error::NotAtRest`] after
    /// [`MAX_SKIPS`] moves of the clock within `d`.
    pub async fn advance(&self, d: Duration) -> Result<()> {
        let target = self
            .now_ms()
            .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        // What is due now runs first; an agent still at work after a moment is left
        // at it (it may be waiting for this very move: a step's timeout).
        if let Err(e) = self.rest_within(FIRST_MOVE_PATIENCE).await
            && self.crashed()
        {
            return Err(e);
        }
        for _ in 0..MAX_SKIPS {
            let next = self.next_timer_ms().await?;
            let step = next.map_or(target, |t| t.min(target));
            let ahead = u64::try_from(step.saturating_sub(self.now_ms())).unwrap_or(0);
            self.clock.advance(Duration::from_millis(ahead));
            self.run_until_idle().await?;
            if self.now_ms() >= target {
                return Ok(());
            }
        }
        Err(Error::NotAtRest(format!(
            "more than {MAX_SKIPS} timers fell due within {d:?}"
        )))
    }

    /// Waits (real time, at most its patience, [`PATIENCE`] by default) until the runtime is at rest: no
    /// message in flight, none due by the clock, no schedule due. The clock does not
    /// move.
    ///
    /// # Errors
    /// [`Error::NotAtRest`] naming what was still in flight or due when its patience
    /// ran out; a store error.
    pub async fn run_until_idle(&self) -> Result<()> {
        self.rest_within(self.patience).await
    }

    /// [`run_until_idle`](Self::run_until_idle) with `patience`.
    async fn rest_within(&self, patience: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + patience;
        let mut quiet_before = false;
        loop {
            if self.crashed() {
                return Err(Error::NotAtRest(
                    "it crashed at its crash point (crash_before_hop): restart it".into(),
                ));
            }
            let busy = self.busy().await?;
            if busy.is_none() && quiet_before {
                return Ok(());
            }
            quiet_before = busy.is_none();
            if let Some(what) = busy
                && tokio::time::Instant::now() >= deadline
            {
                return Err(Error::NotAtRest(format!(
                    "after {patience:?} of real time, {what}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// When the next timer falls due, by the clock, strictly after now: the earliest
    /// message due later (a sleep's wake-up, a retry, a step's or saga's deadline; at a
    /// destination its circuit breaker pauses, no sooner than its next probe), wait on
    /// the clock (a rate-limit slot) or schedule slot; `None` if nothing waits on time.
    ///
    /// # Errors
    /// A store error.
    pub async fn next_timer_ms(&self) -> Result<Option<i64>> {
        let now = self.now_ms();
        let paused = self.paused_until();
        let rows = Sql::new(
            "SELECT destination, min(available_at) AS t,
                    min(CASE WHEN available_at > {now_ms} THEN available_at END) AS later
               FROM outbox WHERE state = 'pending' GROUP BY destination",
        )
        .fetch_all(self.runtime.store().reader())
        .await?;
        let mut next: Option<i64> = None;
        let mut take = |t: i64| next = Some(next.map_or(t, |n: i64| n.min(t)));
        for row in &rows {
            match paused.get(&row.text("destination")?) {
                // A paused destination's rows go no sooner than its next probe.
                Some(&probe) => take(row.int("t")?.max(probe)),
                None => {
                    if let Some(t) = row.opt_int("later")? {
                        take(t);
                    }
                }
            }
        }
        // A delivery waiting on the clock (a rate-limit slot) wakes at its time.
        if let (_, Some(t)) = self.runtime.faults.waits()
            && t > now
        {
            take(t);
        }
        let slot = Sql::new(
            "SELECT min(next_due_ms) AS t FROM saga_schedules
              WHERE NOT paused AND next_due_ms > {now_ms}",
        )
        .fetch_one(self.runtime.store().reader())
        .await?
        .opt_int("t")?;
        if let Some(t) = slot {
            take(t);
        }
        Ok(next)
    }

    /// The destinations the relay's circuit breakers pause now, each with when (by
    /// the clock, Unix ms) its next probe may go.
    fn paused_until(&self) -> std::collections::HashMap<String, i64> {
        let Some(relay) = &self.runtime.relay else {
            return std::collections::HashMap::new();
        };
        let now = self.runtime.store().clock().now();
        relay
            .pauses()
            .into_iter()
            .filter(|(_, until)| *until > now)
            .map(|(d, until)| {
                let ahead = i64::try_from((until - now).as_millis()).unwrap_or(i64::MAX);
                (d, self.now_ms().saturating_add(ahead))
            })
            .collect()
    }

    /// Runs saga `id` to its end: runs what is due, then moves the clock to the next
    /// timer, again and again, until the saga is completed, compensated, failed or
    /// stuck, or nothing is left that time could bring (it waits for a signal only a
    /// test can send): its state then.
    ///
    /// # Errors
    /// As [`run_until_idle`](Self::run_until_idle); [`Error::NotAtRest`] after
    /// [`MAX_SKIPS`] moves of the clock; [`Error::NotRecorded`] once a step of the
    /// saga asked a [`Recording`] for a call it does not hold; the saga unknown.
    pub async fn run_to_end(&self, id: SagaId) -> Result<SagaState> {
        for _ in 0..MAX_SKIPS {
            self.run_until_idle().await?;
            if let Some(why) = recording::missed(id) {
                return Err(Error::NotRecorded(why));
            }
            let state = self.state(id).await?;
            if state.is_terminal() || state == SagaState::Stuck {
                return Ok(state);
            }
            let Some(next) = self.next_timer_ms().await? else {
                return Ok(state);
            };
            let ahead = u64::try_from(next.saturating_sub(self.now_ms())).unwrap_or(0);
            self.clock.advance(Duration::from_millis(ahead));
        }
        Err(Error::NotAtRest(format!(
            "saga {id} had not ended after {MAX_SKIPS} moves of the clock"
        )))
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

    /// What keeps the runtime busy, if anything: messages in flight, due, or a
    /// schedule due.
    async fn busy(&self) -> Result<Option<String>> {
        let paused = self.paused_until();
        let rows = Sql::new(
            "SELECT destination, sum(state = 'in_flight') AS in_flight,
                    sum(state = 'pending') AS due
               FROM outbox
              WHERE state = 'in_flight' OR (state = 'pending' AND available_at <= {now_ms})
              GROUP BY destination",
        )
        .fetch_all(self.runtime.store().reader())
        .await?;
        let (mut in_flight, mut due, mut at) = (0, 0, Vec::new());
        for row in &rows {
            let destination = row.text("destination")?;
            // Due rows of a destination its breaker pauses wait for its next probe.
            let waits = paused.contains_key(&destination);
            let (f, d) = (row.int("in_flight")?, row.int("due")?);
            let d = if waits { 0 } else { d };
            if f + d > 0 {
                at.push(destination);
            }
            (in_flight, due) = (in_flight + f, due + d);
        }
        // Deliveries in flight that only wait on the clock are timers, not work.
        let (waiting, _) = self.runtime.faults.waits();
        in_flight = in_flight.saturating_sub(i64::try_from(waiting).unwrap_or(i64::MAX));
        let schedules = Sql::new(
            "SELECT count(*) AS n FROM saga_schedules WHERE NOT paused AND next_due_ms <= {now_ms}",
        )
        .fetch_one(self.runtime.store().reader())
        .await?
        .int("n")?;
        if in_flight + due + schedules == 0 {
            return Ok(None);
        }
        Ok(Some(format!(
            "{in_flight} message(s) in flight and {due} due (destinations: {}), \
             {schedules} schedule(s) due",
            at.join(",")
        )))
    }
}
