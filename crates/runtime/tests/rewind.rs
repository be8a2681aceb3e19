//! An operator's rewind through the runtime, on both backends and the test clock, with
//! a crash (`kill -9`) at each commit of the rewind's hops in turn: the restarted
//! runtime undoes the rewound step once, runs it again once, and the saga completes
//! with every promise kept (`check_promises` counts the run a rewind went back on).

#[path = "support/echo.rs"]
mod echo;
#[path = "support/under_test.rs"]
mod under_test;

use std::time::Duration;

use agentsaga_core::testing::Backend;
use agentsaga_runtime::{Error, Runtime, RuntimeBuilder};
use agentsaga_saga::{SagaDefinition, SagaState, Step, query};
use echo::Echo;
use serde_json::{Value, json};

const HOUR: Duration = Duration::from_secs(3600);

/// `research`, `draft` (each undone by its agent), an hour's sleep, then `send` (the
/// pivot).
fn drafting() -> SagaDefinition {
    let undo =
        |d: &'static str| Step::new(d, d).compensate(d, move |_: &Value| json!({ "undo": d }));
    agentsaga_saga::Saga::<Value>::builder("drafting", 1)
        .step(undo("research"))
        .step(undo("draft"))
        .step(Step::sleep("wait", HOUR))
        .pivot(Step::new("send", "mailer"))
        .build()
        .unwrap()
}

fn builder() -> RuntimeBuilder {
    ["research", "draft", "mailer"]
        .into_iter()
        .fold(Runtime::builder(), |b, d| b.agent(Echo(d)))
        .saga(drafting())
}

/// Rewinds a paused drafting saga to `draft`, crashing before (or after) the `k`-th
/// commit of hops after the rewind's, and restarts: `false` if the saga came to rest
/// before its `k`-th commit (no crash).
async fn crash_in_rewind(backend: Backend, k: u64, after: bool) -> bool {
    let t = under_test::start(backend, builder()).await;
    let id = t.start_saga("drafting", &json!({})).await.unwrap();
    t.run_until_idle().await.unwrap();
    let mut tx = t.store().begin().await.unwrap();
    t.engine()
        .pause(&mut tx, id, "ops-anna", "read the draft")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // The sleep ends while paused; the pivot is held, nothing is in flight.
    t.advance(2 * HOUR).await.unwrap();
    assert_eq!(t.calls("mailer").await.unwrap(), 0);
    let mut tx = t.store().begin().await.unwrap();
    t.engine()
        .rewind(&mut tx, id, "draft", "ops-anna", "off topic")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // Counted from the rewind's commit on (on SQLite that commit is the lane's too).
    if after {
        t.crash_after_hop(k);
    } else {
        t.crash_before_hop(k);
    }
    match t.until_crash().await {
        Ok(()) => {}
        Err(Error::NotAtRest(why)) if why.contains("came to rest") => {
            t.shutdown().await;
            return false;
        }
        Err(e) => panic!("k = {k}: {e}"),
    }
    let t = t.restart(builder()).await.unwrap();
    let end = t.run_to_end(id).await.unwrap();
    assert_eq!(
        end,
        SagaState::Completed,
        "crashed at commit {k} (after: {after})"
    );
    t.check_promises(id)
        .await
        .unwrap_or_else(|e| panic!("crashed at commit {k} (after: {after}): {e}"));
    assert_eq!(
        [
            t.effects("research"),
            t.effects("draft"),
            t.effects("mailer")
        ],
        [1, 3, 1],
        "crashed at commit {k} (after: {after}): `draft` done, undone, done again; the rest once"
    );
    let rewinds = query::rewinds(t.store(), id).await.unwrap();
    assert_eq!(rewinds.len(), 1);
    assert!(rewinds[0].done_ms.is_some());
    t.shutdown().await;
    true
}

async fn a_crash_during_a_rewind_loses_nothing(backend: Backend) {
    for after in [false, true] {
        let mut crashed = 0;
        for k in 1..=10 {
            if !crash_in_rewind(backend, k, after).await {
                break;
            }
            crashed += 1;
        }
        eprintln!("after {after}: a crash at each of {crashed} commits");
        assert!(crashed >= 2, "the rewind went through {crashed} commits");
    }
}
agentsaga_core::both_backends!(
    a_crash_during_a_rewind_loses_nothing,
    a_crash_during_a_rewind_loses_nothing
);
