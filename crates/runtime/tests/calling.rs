//! Agents that wait on the outside world (`CallingAgent`), on both backends: their
//! waits hold no database, run hundreds at once, outlive leases, are cancelled past
//! their step's timeout, and see one idempotency key per step.
//!
//! Waits are gates the test opens, not sleeps it hopes are long enough: "while one
//! call waits, 100 sagas complete" holds however slow the machine is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "support/echo.rs"]
mod echo;

use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_core::{MessageId, RetryPolicy, both_backends};
use agentsaga_relay::RelayConfig;
use agentsaga_runtime::{
    Agent, AgentContext, CallContext, CallingAgent, Runtime, RuntimeBuilder, StepError,
};
use agentsaga_saga::{Saga, SagaId, SagaState, Step, query};
use echo::Echo;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;

/// What a calling agent saw: calls in flight and their peak, each call's key.
#[derive(Default)]
struct Calls {
    in_flight: AtomicU32,
    peak: AtomicU32,
    started: AtomicU32,
    finished: AtomicU32,
    cancelled: AtomicU32,
    /// (idempotency key, message id, compensation?) of each call, in start order.
    seen: Mutex<Vec<(String, MessageId, bool)>>,
}

impl Calls {
    fn seen(&self) -> Vec<(String, MessageId, bool)> {
        self.seen.lock().unwrap().clone()
    }
}

/// Counts a call in flight; on drop, counts it finished or (if dropped before
/// `done`) cancelled.
struct InFlight<'a> {
    calls: &'a Calls,
    done: bool,
}

impl<'a> InFlight<'a> {
    fn enter(calls: &'a Calls, ctx: &CallContext<'_>) -> Self {
        calls.seen.lock().unwrap().push((
            ctx.idempotency_key(),
            ctx.message_id(),
            ctx.is_compensation(),
        ));
        calls.started.fetch_add(1, Ordering::SeqCst);
        let now = calls.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        calls.peak.fetch_max(now, Ordering::SeqCst);
        Self { calls, done: false }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.calls.in_flight.fetch_sub(1, Ordering::SeqCst);
        if self.done {
            self.calls.finished.fetch_add(1, Ordering::SeqCst);
        } else {
            self.calls.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// What a call does, chosen per call (in start order) by the test.
#[derive(Clone, Copy, Debug)]
enum Act {
    /// Waits until the gate opens.
    Gate,
    /// Sleeps this long.
    Sleep(Duration),
    /// Fails as infrastructure: the relay delivers the same message again.
    Infra,
    /// Answers at once.
    Answer,
}

/// A calling agent whose calls do what `script` says (the last entry repeats).
struct Outside {
    destination: &'static str,
    calls: Arc<Calls>,
    gate: watch::Receiver<bool>,
    script: Vec<Act>,
}

impl Outside {
    fn new(destination: &'static str, script: Vec<Act>) -> (Self, Arc<Calls>, watch::Sender<bool>) {
        let calls = Arc::new(Calls::default());
        let (open, gate) = watch::channel(false);
        let agent = Self {
            destination,
            calls: Arc::clone(&calls),
            gate,
            script,
        };
        (agent, calls, open)
    }
}

#[async_trait::async_trait]
impl CallingAgent for Outside {
    type Command = Value;
    type Output = String;
    type Reply = String;

    fn destination(&self) -> &str {
        self.destination
    }

    async fn call(&self, ctx: &CallContext<'_>, _: &Value) -> Result<String, StepError> {
        let n = self.calls.started.load(Ordering::SeqCst) as usize;
        let act = self.script[n.min(self.script.len() - 1)];
        let mut guard = InFlight::enter(&self.calls, ctx);
        match act {
            Act::Gate => {
                let mut gate = self.gate.clone();
                let _ = gate.wait_for(|open| *open).await;
            }
            Act::Sleep(d) => tokio::time::sleep(d).await,
            Act::Infra => {
                guard.done = true;
                return Err(StepError::Infrastructure("the API is unreachable".into()));
            }
            Act::Answer => {}
        }
        guard.done = true;
        Ok(ctx.idempotency_key())
    }

    async fn record(
        &self,
        _ctx: &mut AgentContext<'_>,
        _: Value,
        answer: String,
    ) -> Result<String, StepError> {
        Ok(answer)
    }
}

#[derive(Serialize, Deserialize)]
struct Job {
    n: u32,
}

fn quick_retry() -> RetryPolicy {
    RetryPolicy::new(Duration::from_millis(10), Duration::from_millis(50), 5)
}

async fn builder(backend: Backend) -> RuntimeBuilder {
    Runtime::builder()
        .database(fresh_url(backend).await)
        .relay_config(RelayConfig::default().retry(quick_retry()))
}

/// [`builder`] with leases of `lease`.
async fn builder_with_lease(backend: Backend, lease: Duration) -> RuntimeBuilder {
    Runtime::builder()
        .database(fresh_url(backend).await)
        .relay_config(RelayConfig::default().retry(quick_retry()).lease(lease))
}

async fn settle(rt: &Runtime, id: SagaId) -> SagaState {
    tokio::time::timeout(Duration::from_secs(60), rt.wait(id))
        .await
        .expect("the saga settles within a minute")
        .unwrap()
}

/// Waits (bounded) until `cond` holds.
async fn until(what: &str, cond: impl Fn() -> bool) {
    agentsaga_core::testing::wait_until(what, Duration::from_secs(60), async || cond()).await;
}

// While one agent waits on the outside world, 100 sagas of fast agents complete: the
// wait holds no transaction (on SQLite, not the single writer) and no actor.
async fn a_waiting_call_blocks_nobody(backend: Backend) {
    let (llm, calls, open) = Outside::new("llm", vec![Act::Gate]);
    let slow = Saga::<Job>::builder("slow", 1)
        .step(Step::new("ask", "llm").nothing_to_undo())
        .build()
        .unwrap();
    let fast = Saga::<Job>::builder("fast", 1)
        .step(Step::new("a", "a").compensate("a", |_: &Job| json!("undo")))
        .step(Step::new("b", "b").compensate("b", |_: &Job| json!("undo")))
        .build()
        .unwrap();
    let rt = builder(backend)
        .await
        .calling_agent(llm)
        .agent(Echo("a"))
        .agent(Echo("b"))
        .saga(slow)
        .saga(fast)
        .start()
        .await
        .unwrap();
    let waiting = rt.start_saga("slow", &Job { n: 0 }).await.unwrap();
    until("the slow call started", || {
        calls.in_flight.load(Ordering::SeqCst) == 1
    })
    .await;
    let mut ids = Vec::new();
    for n in 0..100 {
        ids.push(rt.start_saga("fast", &Job { n }).await.unwrap());
    }
    for id in ids {
        assert_eq!(settle(&rt, id).await, SagaState::Completed);
    }
    // All 100 finished while the call still waits.
    assert_eq!(calls.in_flight.load(Ordering::SeqCst), 1);
    let s = query::get(rt.store(), waiting).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Running);
    open.send_replace(true);
    assert_eq!(settle(&rt, waiting).await, SagaState::Completed);
    assert_eq!(calls.started.load(Ordering::SeqCst), 1);
    rt.shutdown().await;
}
both_backends!(waiting_call_tests, a_waiting_call_blocks_nobody);

// 100 sagas whose agent waits: all 100 calls are in flight at once (with the default
// concurrency), so they take about one wait, not a hundred.
async fn hundred_waits_run_at_once(backend: Backend) {
    let (llm, calls, open) = Outside::new("llm", vec![Act::Gate]);
    let saga = Saga::<Job>::builder("ask", 1)
        .step(Step::new("ask", "llm").nothing_to_undo())
        .build()
        .unwrap();
    let rt = builder(backend)
        .await
        .calling_agent(llm)
        .saga(saga)
        .start()
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut ids = Vec::new();
    for n in 0..100 {
        ids.push(rt.start_saga("ask", &Job { n }).await.unwrap());
    }
    // The gate opens only once every call waits at the same time: with a concurrency
    // below 100 this never happens, and the test fails on its bound.
    until("100 calls wait at once", || {
        calls.in_flight.load(Ordering::SeqCst) == 100
    })
    .await;
    open.send_replace(true);
    for id in ids {
        assert_eq!(settle(&rt, id).await, SagaState::Completed);
    }
    assert_eq!(calls.peak.load(Ordering::SeqCst), 100);
    assert_eq!(calls.started.load(Ordering::SeqCst), 100);
    eprintln!("100 gated sagas took {:?}", started.elapsed());
    rt.shutdown().await;
}
both_backends!(hundred_waits_tests, hundred_waits_run_at_once);

// A call that outlives many leases (and the old 30 s delivery limit, scaled down) is
// neither retried nor dead-lettered while it runs: the relay renews its lease.
async fn a_long_call_keeps_its_lease(backend: Backend) {
    let (llm, calls, _open) = Outside::new("llm", vec![Act::Sleep(Duration::from_millis(1500))]);
    let saga = Saga::<Job>::builder("long", 1)
        .step(
            Step::new("think", "llm")
                .timeout(Duration::from_secs(30))
                .nothing_to_undo(),
        )
        .build()
        .unwrap();
    let rt = builder_with_lease(backend, Duration::from_millis(200))
        .await
        .calling_agent(llm)
        .saga(saga)
        .start()
        .await
        .unwrap();
    let id = rt.start_saga("long", &Job { n: 1 }).await.unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Completed);
    assert_eq!(calls.started.load(Ordering::SeqCst), 1, "called once");
    assert_eq!(calls.cancelled.load(Ordering::SeqCst), 0);
    let stats = rt.relay_stats().unwrap();
    assert_eq!(stats.retried, 0, "{stats:?}");
    assert_eq!(stats.dead, 0, "{stats:?}");
    assert_eq!(rt.store().admin().stats().await.unwrap().dead, 0);
    rt.shutdown().await;
}
both_backends!(long_call_tests, a_long_call_keeps_its_lease);

// Past its step's timeout a call is cancelled and the step follows the timeout rules
// (here: compensation, before the pivot). The compensation's idempotency key differs
// from the command's.
async fn a_call_past_its_timeout_is_cancelled(backend: Backend) {
    // The first call (the command) hangs; the next (the compensation) answers.
    let (llm, calls, _open) = Outside::new("llm", vec![Act::Gate, Act::Answer]);
    let saga = Saga::<Job>::builder("hangs", 1)
        .step(
            Step::new("book", "llm")
                .timeout(Duration::from_millis(300))
                .retry(quick_retry())
                .compensate("llm", |_: &Job| json!("cancel")),
        )
        .build()
        .unwrap();
    let rt = builder(backend)
        .await
        .calling_agent(llm)
        .saga(saga)
        .start()
        .await
        .unwrap();
    let id = rt.start_saga("hangs", &Job { n: 1 }).await.unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Compensated);
    until("the hanging call is cancelled", || {
        calls.cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
    let seen = calls.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let (command, undo) = (&seen[0], &seen[1]);
    assert!(!command.2 && undo.2, "{seen:?}");
    assert_ne!(command.0, undo.0, "the undo has a key of its own");
    assert_eq!(command.0, format!("agentsaga:{id}:0:command"));
    assert_eq!(undo.0, format!("agentsaga:{id}:0:compensate"));
    let s = query::get(rt.store(), id).await.unwrap().unwrap();
    assert!(
        s.error.as_deref().unwrap_or_default().contains("timed out"),
        "{:?}",
        s.error
    );
    rt.shutdown().await;
}
both_backends!(timeout_tests, a_call_past_its_timeout_is_cancelled);

// The idempotency key stays the same across a redelivery of one message (after an
// infrastructure failure) and across a re-send of the step after its timeout (a new
// message): the outside world sees one key for one step.
async fn one_key_across_redelivery_and_resend(backend: Backend) {
    let (llm, calls, _open) = Outside::new("llm", vec![Act::Infra, Act::Gate, Act::Answer]);
    // A pivot is retried forward after a timeout: the command is sent again.
    let saga = Saga::<Job>::builder("send", 1)
        .pivot(
            Step::new("send", "llm")
                .timeout(Duration::from_millis(300))
                .retry(quick_retry()),
        )
        .build()
        .unwrap();
    let rt = builder(backend)
        .await
        .calling_agent(llm)
        .saga(saga)
        .start()
        .await
        .unwrap();
    let id = rt.start_saga("send", &Job { n: 1 }).await.unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Completed);
    let seen = calls.seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    let key = format!("agentsaga:{id}:0:command");
    assert!(seen.iter().all(|(k, ..)| *k == key), "{seen:?}");
    assert_eq!(seen[0].1, seen[1].1, "a redelivery is the same message");
    assert_ne!(seen[1].1, seen[2].1, "a re-send is a new message");
    let by_id: HashMap<MessageId, usize> = seen.iter().fold(HashMap::new(), |mut m, s| {
        *m.entry(s.1).or_default() += 1;
        m
    });
    assert_eq!(by_id.len(), 2);
    rt.shutdown().await;
}
both_backends!(key_tests, one_key_across_redelivery_and_resend);

// Overload costs time, not work: a burst whose backlog lasts far longer than the
// steps' timeout completes, nothing timed out, because a step's timeout counts from
// when its agent starts on it, not from dispatch.
async fn a_backlog_longer_than_the_timeout_completes(backend: Backend) {
    let step = |name: &'static str| {
        Step::<Job>::new(name, name)
            .timeout(Duration::from_millis(200))
            .retry(quick_retry())
            .compensate(name, |_: &Job| json!("undo"))
    };
    let saga = Saga::<Job>::builder("burst", 1)
        .step(step("a"))
        .step(step("b"))
        .step(step("c"))
        .build()
        .unwrap();
    let rt = builder(backend)
        .await
        .agent(Echo("a"))
        .agent(Echo("b"))
        .agent(Echo("c"))
        .saga(saga)
        .start()
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut tx = rt.store().begin().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..400 {
        ids.push(
            rt.start_saga_in(&mut tx, "burst", &Job { n })
                .await
                .unwrap(),
        );
    }
    tx.commit().await.unwrap();
    rt.store().wake();
    let mut states = HashMap::new();
    for id in ids {
        *states.entry(settle(&rt, id).await).or_insert(0) += 1;
    }
    let took = started.elapsed();
    eprintln!("400 sagas with 200 ms step timeouts: {took:?}, {states:?}");
    assert_eq!(states, HashMap::from([(SagaState::Completed, 400)]));
    rt.shutdown().await;
}
both_backends!(backlog_tests, a_backlog_longer_than_the_timeout_completes);

/// Inserts one row per handling into `effects` (through the handler's transaction);
/// the first handling then outlives the step's timeout.
struct SlowOnce {
    handled: Arc<AtomicU32>,
}

#[async_trait::async_trait]
impl Agent for SlowOnce {
    type Command = Value;
    type Reply = u32;
    fn destination(&self) -> &str {
        "ledger"
    }
    async fn handle(&self, ctx: &mut AgentContext<'_>, _: Value) -> Result<u32, StepError> {
        let saga = ctx.saga_id().unwrap().to_string();
        match ctx.conn() {
            agentsaga_core::Conn::Sqlite(c) => {
                agentsaga_core::sqlx::query("INSERT INTO effects (saga) VALUES (?1)")
                    .bind(&saga)
                    .execute(c)
                    .await?;
            }
            agentsaga_core::Conn::Postgres(c) => {
                agentsaga_core::sqlx::query("INSERT INTO effects (saga) VALUES ($1)")
                    .bind(&saga)
                    .execute(c)
                    .await?;
            }
        }
        if self.handled.fetch_add(1, Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        Ok(1)
    }
}

// A forward-only step that was slow, not lost, is sent again after its timeout; its
// database effects still happen once: the slow handling is cancelled at the timeout,
// before it commits, so only the re-sent command's effects are kept.
async fn a_slow_step_sent_again_applies_its_effects_once(backend: Backend) {
    let handled = Arc::new(AtomicU32::new(0));
    let saga = Saga::<Job>::builder("pay", 1)
        .pivot(
            Step::new("pay", "ledger")
                .timeout(Duration::from_millis(300))
                .retry(quick_retry()),
        )
        .build()
        .unwrap();
    let rt = builder(backend)
        .await
        .agent(SlowOnce {
            handled: Arc::clone(&handled),
        })
        .saga(saga)
        .start()
        .await
        .unwrap();
    let mut tx = rt.store().begin().await.unwrap();
    match tx.conn() {
        agentsaga_core::Conn::Sqlite(c) => {
            agentsaga_core::sqlx::query("CREATE TABLE effects (saga TEXT NOT NULL)")
                .execute(c)
                .await
                .unwrap();
        }
        agentsaga_core::Conn::Postgres(c) => {
            agentsaga_core::sqlx::query("CREATE TABLE effects (saga TEXT NOT NULL)")
                .execute(c)
                .await
                .unwrap();
        }
    }
    tx.commit().await.unwrap();
    let id = rt.start_saga("pay", &Job { n: 1 }).await.unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Completed);
    assert_eq!(
        handled.load(Ordering::SeqCst),
        2,
        "handled twice: slow, then again"
    );
    let steps = query::steps(rt.store(), id).await.unwrap();
    assert_eq!(steps[0].attempts, 2, "{steps:?}");
    let mut tx = rt.store().begin().await.unwrap();
    let rows: i64 = match tx.conn() {
        agentsaga_core::Conn::Sqlite(c) => {
            agentsaga_core::sqlx::query_scalar("SELECT count(*) FROM effects")
                .fetch_one(c)
                .await
                .unwrap()
        }
        agentsaga_core::Conn::Postgres(c) => {
            agentsaga_core::sqlx::query_scalar("SELECT count(*) FROM effects")
                .fetch_one(c)
                .await
                .unwrap()
        }
    };
    tx.rollback().await.unwrap();
    assert_eq!(rows, 1, "the effects happened once");
    rt.shutdown().await;
}
both_backends!(
    slow_step_tests,
    a_slow_step_sent_again_applies_its_effects_once
);

/// Runs `sql` (the same text on both backends) in a transaction of `rt`'s store.
async fn execute(rt: &Runtime, sql: &'static str) -> u64 {
    let mut tx = rt.store().begin().await.unwrap();
    let n = agentsaga_core::with_conn!(tx.conn(), c => {
        agentsaga_core::sqlx::query(sql).execute(c).await.unwrap().rows_affected()
    });
    tx.commit().await.unwrap();
    n
}

// A worker that lost its lease learns it and stops: here another relay ("thief") has
// taken the row over while the call waits. The relay's next renewal finds the row is
// not its own, and the call is cancelled (its future dropped) rather than left to land
// after the row's new owner has moved on (an outside "do" after its "undo"). Its outcome
// is not written. Once the row comes back, it is delivered again and completes.
async fn a_call_whose_lease_is_lost_is_cancelled(backend: Backend) {
    let (llm, calls, _open) = Outside::new("llm", vec![Act::Gate, Act::Answer]);
    // The step's timeout is far beyond the test's bounds: only the lost lease can
    // cancel the call in time.
    let saga = Saga::<Job>::builder("lost", 1)
        .step(
            Step::new("think", "llm")
                .timeout(Duration::from_secs(600))
                .nothing_to_undo(),
        )
        .build()
        .unwrap();
    let rt = builder_with_lease(backend, Duration::from_millis(300))
        .await
        .calling_agent(llm)
        .saga(saga)
        .start()
        .await
        .unwrap();
    let id = rt.start_saga("lost", &Job { n: 1 }).await.unwrap();
    let began = std::time::Instant::now();
    until("the call waits", || {
        calls.in_flight.load(Ordering::SeqCst) == 1
    })
    .await;
    eprintln!("the call waits after {:?}", began.elapsed());
    let stolen_at = std::time::Instant::now();
    let stolen = execute(
        &rt,
        "UPDATE outbox SET lease_owner = 'thief' WHERE state = 'in_flight' AND destination = 'llm'",
    )
    .await;
    assert_eq!(stolen, 1);
    until("the call whose lease was lost is cancelled", || {
        calls.cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
    eprintln!("cancelled {:?} after the theft", stolen_at.elapsed());
    assert!(rt.relay_stats().unwrap().leases_lost >= 1);
    // The thief dies: its lease runs out, the row comes back, and this relay delivers it
    // again (the second call answers).
    assert_eq!(settle(&rt, id).await, SagaState::Completed);
    assert_eq!(calls.started.load(Ordering::SeqCst), 2);
    assert_eq!(calls.cancelled.load(Ordering::SeqCst), 1);
    rt.shutdown().await;
}
both_backends!(lost_lease_tests, a_call_whose_lease_is_lost_is_cancelled);
