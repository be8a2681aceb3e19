//! `testing::TestRuntime` crashes the runtime just before its k-th commit of hops and
//! starts it again on the same database, for every k a saga goes through: the saga
//! ends as it would have, each effect once, every promise kept.

#[path = "support/echo.rs"]
mod echo;
#[path = "support/under_test.rs"]
mod under_test;

use std::time::Duration;

use agentsaga_core::RetryPolicy;
use agentsaga_core::testing::Backend;
use agentsaga_runtime::{Agent, AgentContext, Error, Runtime, RuntimeBuilder, StepError};
use agentsaga_saga::{Saga, SagaState, Step};
use echo::Echo;
use serde_json::{Value, json};

const MINUTE: Duration = Duration::from_secs(60);

/// A payment provider that declines every card, on every delivery (a fault injected
/// with `fail_next` answers one delivery only, and the delivery a crash cut short is
/// delivered again).
struct Declining;

#[async_trait::async_trait]
impl Agent for Declining {
    type Command = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        "payments"
    }
    async fn handle(&self, _: &mut AgentContext<'_>, _: Value) -> Result<Value, StepError> {
        Err(StepError::fatal("card declined"))
    }
}

/// Flight, hotel (each undone by a cancellation), then the charge (the pivot), then a
/// receipt; every card declined if `declined`.
fn trip_runtime(declined: bool) -> RuntimeBuilder {
    let retry = RetryPolicy::new(MINUTE, 10 * MINUTE, 4);
    let undo = |d: &'static str| {
        Step::new(d, d)
            .compensate(d, |_: &Value| json!({ "cancel": true }))
            .retry(retry)
    };
    let trip = Saga::<Value>::builder("trip", 1)
        .step(undo("airline"))
        .step(undo("hotel"))
        .pivot(Step::new("charge", "payments").retry(retry))
        .step(Step::new("receipt", "mailer").retry(retry))
        .build()
        .unwrap();
    let b = ["airline", "hotel", "mailer"]
        .into_iter()
        .fold(Runtime::builder(), |b, d| b.agent(Echo(d)))
        .saga(trip);
    if declined {
        b.agent(Declining)
    } else {
        b.agent(Echo("payments"))
    }
}

/// Runs a trip, crashing before (or after) the `k`-th commit of hops and restarting:
/// `None` if the trip came to rest before its `k`-th commit (no crash), else how it
/// ended.
async fn crash_at(backend: Backend, k: u64, after: bool, declined: bool) -> Option<SagaState> {
    let t = under_test::start(backend, trip_runtime(declined)).await;
    if after {
        t.crash_after_hop(k);
    } else {
        t.crash_before_hop(k);
    }
    let id = t.start_saga("trip", &json!({})).await.unwrap();
    match t.until_crash().await {
        Ok(()) => {}
        Err(Error::NotAtRest(why)) if why.contains("came to rest") => {
            t.shutdown().await;
            return None;
        }
        Err(e) => panic!("k = {k}: {e}"),
    }
    let err = t.run_until_idle().await.unwrap_err();
    assert!(err.to_string().contains("crashed"), "{err}");
    let t = t.restart(trip_runtime(declined)).await.unwrap();
    let end = t.run_to_end(id).await.unwrap();
    t.check_promises(id)
        .await
        .unwrap_or_else(|e| panic!("crashed at commit {k} (after: {after}): {e}"));
    let once = |d: &str| t.effects(d);
    if end == SagaState::Completed {
        assert_eq!(
            [
                once("airline"),
                once("hotel"),
                once("payments"),
                once("mailer")
            ],
            [1, 1, 1, 1],
            "crashed at commit {k} (after: {after}): each effect once"
        );
    } else {
        assert_eq!(
            once("payments"),
            0,
            "crashed at commit {k} (after: {after})"
        );
    }
    t.shutdown().await;
    Some(end)
}

// A crash before each commit of a trip's hops in turn, and after each (its messages
// never acknowledged, so delivered again), on the happy path and on the path that
// compensates (every card declined at the pivot): the restarted runtime finishes the
// trip as if nothing had happened, each effect once.
async fn a_crash_at_any_hop_loses_nothing(backend: Backend) {
    for after in [false, true] {
        for (declined, want) in [
            (false, SagaState::Completed),
            (true, SagaState::Compensated),
        ] {
            let mut crashed = 0;
            for k in 1..=20 {
                match crash_at(backend, k, after, declined).await {
                    Some(end) => {
                        assert_eq!(end, want, "crashed at commit {k} (after: {after})");
                        crashed += 1;
                    }
                    None => break,
                }
            }
            eprintln!("after {after}, declined {declined}: a crash at each of {crashed} commits");
            assert!(crashed >= 4, "the trip went through {crashed} commits");
        }
    }
}

// The link to the payment provider cut for two hours (a broker outage, a partition):
// the trip waits at the pivot, nothing is dead-lettered and nothing fails; mended, the
// trip is charged and completes, each effect once.
async fn a_cut_link_holds_the_saga_until_it_is_mended(backend: Backend) {
    let t = under_test::start(backend, trip_runtime(false)).await;
    t.cut_link("payments");
    let id = t.start_saga("trip", &json!({})).await.unwrap();
    // One move of two hours: the clock goes from timer to timer (each retry, each
    // probe of the breaker) as real time would.
    t.advance(120 * MINUTE).await.unwrap();
    assert_eq!(t.state(id).await.unwrap(), SagaState::Running);
    assert_eq!(t.effects("payments"), 0);
    assert_eq!(t.calls("payments").await.unwrap(), 0, "nothing reached it");
    assert_eq!(t.store().admin().stats().await.unwrap().dead, 0);

    t.mend_link("payments");
    assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Completed);
    assert_eq!(t.effects("payments"), 1);
    t.check_promises(id).await.unwrap();
    t.shutdown().await;
}

agentsaga_core::both_backends!(
    a_crash_at_any_hop_loses_nothing,
    a_crash_at_any_hop_loses_nothing
);
agentsaga_core::both_backends!(
    a_cut_link_holds_the_saga_until_it_is_mended,
    a_cut_link_holds_the_saga_until_it_is_mended
);
