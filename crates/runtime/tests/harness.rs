//! `testing::TestRuntime`, as a user of agentsaga tests a saga with it: the real
//! runtime on a fresh database (SQLite's and PostgreSQL's, each test on both) and a
//! manual clock. A saga with a three-day sleep, a
//! step retried twice after backoffs of up to hours and a 30-minute step timeout runs
//! to its end without waiting; a wait for a person stops the run until the test sends
//! the signal; an agent that never answers is timed out by moving the clock.

#[path = "support/echo.rs"]
mod echo;
#[path = "support/under_test.rs"]
mod under_test;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agentsaga_core::RetryPolicy;
use agentsaga_core::testing::Backend;
use agentsaga_runtime::testing::{Fault, START_MS, TestRuntime};
use agentsaga_runtime::{AgentContext, CallContext, CallingAgent, Error, Runtime, StepError};
use agentsaga_saga::{Saga, SagaState, Signal, Step};
use echo::Echo;
use serde_json::{Value, json};

const MINUTE: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(86_400);

/// A payment provider that is busy for the first `busy` calls, then charges.
struct Payments {
    calls: Arc<AtomicUsize>,
    busy: usize,
}

#[async_trait::async_trait]
impl CallingAgent for Payments {
    type Command = Value;
    type Output = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        "payments"
    }
    async fn call(&self, _: &CallContext<'_>, _: &Value) -> Result<Value, StepError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.busy {
            return Err(StepError::retryable("the provider is busy"));
        }
        Ok(json!({ "charged": true }))
    }
    async fn record(
        &self,
        _: &mut AgentContext<'_>,
        _: Value,
        out: Value,
    ) -> Result<Value, StepError> {
        Ok(out)
    }
}

/// An oracle that never answers.
struct Silent;

#[async_trait::async_trait]
impl CallingAgent for Silent {
    type Command = Value;
    type Output = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        "oracle"
    }
    async fn call(&self, _: &CallContext<'_>, _: &Value) -> Result<Value, StepError> {
        std::future::pending().await
    }
    async fn record(
        &self,
        _: &mut AgentContext<'_>,
        _: Value,
        out: Value,
    ) -> Result<Value, StepError> {
        Ok(out)
    }
}

// Three days asleep, two retries after backoffs of up to an hour and two, a step with
// a 30-minute timeout: run to its end by skipping the clock from timer to timer. The
// real time it took is printed (no timed assertion: the machine is shared).
async fn a_saga_of_days_runs_to_its_end_without_waiting(backend: Backend) {
    let calls = Arc::new(AtomicUsize::new(0));
    let renewal = Saga::<Value>::builder("renewal", 1)
        .step(Step::new("remind", "mailer").nothing_to_undo())
        .step(Step::sleep("grace", 3 * DAY))
        .pivot(
            Step::new("charge", "payments")
                .timeout(30 * MINUTE)
                .retry(RetryPolicy::new(60 * MINUTE, 120 * MINUTE, 5)),
        )
        .step(Step::new("receipt", "mailer"))
        .build()
        .unwrap();
    let builder = Runtime::builder()
        .agent(Echo("mailer"))
        .calling_agent(Payments {
            calls: Arc::clone(&calls),
            busy: 2,
        })
        .saga(renewal);
    let t = under_test::start(backend, builder).await;
    let began = Instant::now();
    let id = t
        .start_saga("renewal", &json!({ "plan": "pro" }))
        .await
        .unwrap();
    assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Completed);
    let took = began.elapsed();

    assert_eq!(calls.load(Ordering::SeqCst), 3, "busy twice, then charged");
    // Each attempt is a message of its own, handled once: two busy, one charged.
    assert_eq!(t.calls("payments").await.unwrap(), 3);
    assert_eq!(
        t.calls("mailer").await.unwrap(),
        2,
        "the reminder and the receipt"
    );
    let moved = Duration::from_millis(u64::try_from(t.now_ms() - START_MS).unwrap());
    assert!(
        moved >= 3 * DAY && moved <= 3 * DAY + 4 * 120 * MINUTE,
        "the clock moved through the sleep and the backoffs: {moved:?}"
    );
    eprintln!(
        "{backend:?}: a saga of {:.1} days of clock ran to its end in {took:?} of real time",
        moved.as_secs_f64() / 86_400.0
    );
    t.shutdown().await;
}

// A wait for a person stops the run where it waits: `run_to_end` gives the saga back
// running; the test approves as the person would, and the run goes on to the end.
async fn a_run_stops_at_a_wait_for_a_person(backend: Backend) {
    let order = Saga::<Value>::builder("order", 1)
        .step(Step::approval("manager"))
        .pivot(Step::new("place", "shop"))
        .build()
        .unwrap();
    let t = under_test::start(backend, Runtime::builder().agent(Echo("shop")).saga(order)).await;
    let id = t.start_saga("order", &json!({})).await.unwrap();
    assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Running);
    assert_eq!(t.calls("shop").await.unwrap(), 0);

    t.signal(id, "manager", Signal::Approve(json!("ok")))
        .await
        .unwrap();
    assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Completed);
    assert_eq!(t.calls("shop").await.unwrap(), 1);
    let trace = t.trace(id);
    assert!(trace.is_ok(), "{:?}", trace.map(|t| t.roots().len()));
    t.shutdown().await;
}

// An agent that never answers keeps the runtime from rest, and the harness says so,
// naming its destination, instead of skipping time under it; moving the clock past
// the step's timeout ends the step, and the saga is compensated.
async fn a_silent_agent_is_timed_out_by_moving_the_clock(backend: Backend) {
    let ask = Saga::<Value>::builder("ask", 1)
        .step(
            Step::new("think", "oracle")
                .timeout(30 * MINUTE)
                .nothing_to_undo(),
        )
        .pivot(Step::new("answer", "shop"))
        .build()
        .unwrap();
    let builder = Runtime::builder()
        .calling_agent(Silent)
        .agent(Echo("shop"))
        .saga(ask);
    let mut t = under_test::start(backend, builder).await;
    t.set_patience(Duration::from_millis(300));
    let id = t.start_saga("ask", &json!({})).await.unwrap();

    let err = t.run_to_end(id).await.unwrap_err();
    assert!(
        matches!(&err, Error::NotAtRest(what) if what.contains("oracle")),
        "{err}"
    );
    t.set_patience(Duration::from_secs(30));
    t.advance(30 * MINUTE).await.unwrap();
    assert_eq!(t.state(id).await.unwrap(), SagaState::Compensated);
    assert_eq!(t.calls("shop").await.unwrap(), 0);
    t.shutdown().await;
}

/// A trip: the hotel booked (undone by a cancellation), then the pivot, the charge.
fn trip() -> agentsaga_saga::SagaDefinition {
    Saga::<Value>::builder("trip", 1)
        .step(
            Step::new("book", "hotel")
                .compensate("hotel", |_: &Value| json!({ "cancel": true }))
                .retry(RetryPolicy::new(MINUTE, 10 * MINUTE, 5)),
        )
        .pivot(
            Step::new("charge", "payments")
                .timeout(30 * MINUTE)
                .retry(RetryPolicy::new(MINUTE, 10 * MINUTE, 5)),
        )
        .build()
        .unwrap()
}

async fn trip_runtime(backend: Backend, calls: &Arc<AtomicUsize>) -> TestRuntime {
    let builder = Runtime::builder()
        .agent(Echo("hotel"))
        .calling_agent(Payments {
            calls: Arc::clone(calls),
            busy: 0,
        })
        .saga(trip());
    under_test::start(backend, builder).await
}

// Faults a test injects take the saga's paths as the agent's own failures would:
// retryable ones are retried after their backoff, a fatal one at the pivot undoes the
// steps before it, a timed-out pivot is sent again, a dead-lettered command is a lost
// step. The faulted deliveries never reach the agent, and each is recorded once.
async fn injected_faults_take_the_sagas_paths(backend: Backend) {
    // Busy twice: retried after its backoffs, then charged by the agent once.
    let calls = Arc::new(AtomicUsize::new(0));
    let t = trip_runtime(backend, &calls).await;
    t.fail_next("payments", 2, &Fault::Retryable("busy".into()));
    let id = t.start_saga("trip", &json!({})).await.unwrap();
    assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Completed);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the agent was called once");
    assert_eq!(t.calls("payments").await.unwrap(), 3);
    assert_eq!(t.calls("hotel").await.unwrap(), 1, "nothing undone");
    t.shutdown().await;

    // Declined for good at the pivot: the hotel is cancelled, the agent never called.
    let calls = Arc::new(AtomicUsize::new(0));
    let t = trip_runtime(backend, &calls).await;
    t.fail_next("payments", 1, &Fault::Fatal("card declined".into()));
    let id = t.start_saga("trip", &json!({})).await.unwrap();
    assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Compensated);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(t.calls("hotel").await.unwrap(), 2, "booked, then cancelled");
    t.shutdown().await;

    // The pivot timed out: its outcome is unknown, so it is sent again, and charged.
    let calls = Arc::new(AtomicUsize::new(0));
    let t = trip_runtime(backend, &calls).await;
    t.fail_next("payments", 1, &Fault::TimedOut);
    let id = t.start_saga("trip", &json!({})).await.unwrap();
    assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Completed);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(t.calls("payments").await.unwrap(), 2);
    t.shutdown().await;

    // The booking dead-lettered: a lost step before the pivot, so the saga turns back
    // (the cancellation goes out: its outcome was unknown) and never charges.
    let calls = Arc::new(AtomicUsize::new(0));
    let t = trip_runtime(backend, &calls).await;
    t.fail_next("hotel", 1, &Fault::DeadLetter("unreadable".into()));
    let id = t.start_saga("trip", &json!({})).await.unwrap();
    let end = t.run_to_end(id).await.unwrap();
    assert_eq!(end, SagaState::Compensated);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let dead = t.store().admin().stats().await.unwrap().dead;
    assert_eq!(dead, 1, "the booking is a dead letter");
    t.shutdown().await;
}

// A message delivered twice (a redelivery after a lost outcome) takes effect once:
// the calling agent's outside call is not made again, each destination records it
// once, and the saga goes on as if it had come once.
async fn a_message_delivered_twice_takes_effect_once(backend: Backend) {
    let calls = Arc::new(AtomicUsize::new(0));
    let t = trip_runtime(backend, &calls).await;
    t.fail_next("hotel", 1, &Fault::Twice);
    t.fail_next("payments", 1, &Fault::Twice);
    let id = t.start_saga("trip", &json!({})).await.unwrap();
    assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Completed);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one outside call");
    assert_eq!(t.calls("payments").await.unwrap(), 1);
    assert_eq!(t.calls("hotel").await.unwrap(), 1);
    // The agents' effects committed once each (an inbox that let the second delivery
    // through would still show one inbox record, but two effects).
    assert_eq!(t.effects("hotel"), 1);
    assert_eq!(t.effects("payments"), 1);
    t.shutdown().await;
}

agentsaga_core::both_backends!(
    a_saga_of_days_runs_to_its_end_without_waiting,
    a_saga_of_days_runs_to_its_end_without_waiting
);
agentsaga_core::both_backends!(
    a_run_stops_at_a_wait_for_a_person,
    a_run_stops_at_a_wait_for_a_person
);
agentsaga_core::both_backends!(
    a_silent_agent_is_timed_out_by_moving_the_clock,
    a_silent_agent_is_timed_out_by_moving_the_clock
);
agentsaga_core::both_backends!(
    injected_faults_take_the_sagas_paths,
    injected_faults_take_the_sagas_paths
);
agentsaga_core::both_backends!(
    a_message_delivered_twice_takes_effect_once,
    a_message_delivered_twice_takes_effect_once
);
