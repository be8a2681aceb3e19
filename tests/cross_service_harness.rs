//! The cross_service example's saga logic (`examples/support/orders.rs`: the `order`
//! saga and its recording agents) on `agentsaga::testing::TestRuntime`, in one process:
//! the payments service's agent hosted beside the shop's, its link cut and mended as a
//! broker outage would, random faults from seeds, and a crash at every commit. Each
//! run is checked against the promises and against the agents' own `effects` table.
//! The two-process runs over a real NATS server stay in `tests/cross_service.rs`.

#[path = "../examples/support/orders.rs"]
mod orders;
#[path = "../examples/support/mod.rs"]
mod support;

use std::time::Duration;

use agentsaga::core::{Sql, Store};
use agentsaga::runtime::{Runtime, RuntimeBuilder};
use agentsaga::saga::{SagaId, SagaState};
use agentsaga_runtime::testing::{self, SEED_VAR, TestRuntime};
use orders::{DDL, Order, Recorder, order_saga};

fn shop() -> RuntimeBuilder {
    Runtime::builder()
        .agent(Recorder("stock"))
        .agent(Recorder("payments"))
        .agent(Recorder("ship"))
        .saga(order_saga().expect("the example's saga"))
}

/// What the agents recorded for saga `id`, as `agent:kind` (`stock:do`, …), sorted.
async fn effects(store: &Store, id: SagaId) -> Vec<String> {
    let rows = Sql::new("SELECT agent, kind FROM effects WHERE saga_id = ?")
        .bind(id.to_string())
        .fetch_all(store.reader())
        .await
        .expect("the example's table");
    let mut out: Vec<String> = rows
        .iter()
        .map(|r| format!("{}:{}", r.text("agent").unwrap(), r.text("kind").unwrap()))
        .collect();
    out.sort();
    out
}

/// The example's own promise, from its `effects` table: a completed order was
/// reserved, charged and shipped, once each, and nothing undone; a compensated one
/// undid each thing it did, once, and shipped nothing (an undo without its do is the
/// compensation of a step whose outcome was unknown: it had nothing to undo).
fn effects_agree(state: SagaState, effects: &[String]) -> Result<(), String> {
    let mut seen = effects.to_vec();
    seen.dedup();
    if seen.len() != effects.len() {
        return Err(format!("an effect recorded twice: {effects:?}"));
    }
    let has = |e: &str| effects.iter().any(|x| x == e);
    let ok = match state {
        SagaState::Completed => effects == ["payments:do", "ship:do", "stock:do"],
        SagaState::Compensated => {
            !has("ship:do")
                && ["stock", "payments"]
                    .iter()
                    .all(|a| !has(&format!("{a}:do")) || has(&format!("{a}:undo")))
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("a {} order recorded {effects:?}", state.as_str()))
    }
}

async fn started(t: &TestRuntime, n: u64) -> SagaId {
    support::create_tables(t.store(), DDL).await.unwrap();
    t.start_saga("order", &Order { n }).await.unwrap()
}

// Orders under random faults (a quarter of the deliveries), one seed each, with the
// payments link cut for an hour in the middle of every other run: each ends, keeps
// its promises, and its effects agree. Every fourth order cannot ship and is refunded.
#[tokio::test]
async fn orders_under_faults_and_outages_keep_their_promises() {
    let seeds = testing::seeds(0..24).unwrap();
    let (mut completed, mut compensated) = (0, 0);
    for seed in seeds {
        let t = TestRuntime::start(shop()).await.unwrap();
        t.random_faults(seed, 0.25);
        let outage = seed % 2 == 1;
        if outage {
            t.cut_link("payments");
        }
        let id = started(&t, seed).await;
        let rerun = format!("seed {seed} (run it alone with {SEED_VAR}={seed})");
        if outage {
            t.advance(Duration::from_secs(3600)).await.unwrap();
            t.mend_link("payments");
        }
        let state = t
            .run_to_end(id)
            .await
            .unwrap_or_else(|e| panic!("{rerun}: {e}"));
        t.check_promises(id)
            .await
            .unwrap_or_else(|e| panic!("{rerun}: {e}"));
        effects_agree(state, &effects(t.store(), id).await)
            .unwrap_or_else(|e| panic!("{rerun}, faults {:?}: {e}", t.faults_drawn()));
        match state {
            SagaState::Completed => completed += 1,
            SagaState::Compensated => compensated += 1,
            _ => {}
        }
        t.shutdown().await;
    }
    eprintln!("{completed} completed, {compensated} compensated");
    if std::env::var(SEED_VAR).is_err() {
        assert!(completed > 0 && compensated > 0, "both ends reached");
    }
}

// A crash just after each commit of an order that cannot ship (so it is refunded and
// released): the restarted shop finishes it, each effect and each undo once.
#[tokio::test]
async fn an_order_crashed_at_any_commit_is_refunded_once() {
    let mut crashed = 0;
    for k in 1..=30 {
        let t = TestRuntime::start(shop()).await.unwrap();
        let id = started(&t, 3).await;
        t.crash_after_hop(k);
        if t.until_crash().await.is_err() {
            t.shutdown().await;
            break; // the order went through fewer commits than k
        }
        let t = t.restart(shop()).await.unwrap();
        let state = t.run_to_end(id).await.unwrap();
        assert_eq!(state, SagaState::Compensated, "crashed after commit {k}");
        t.check_promises(id).await.unwrap();
        assert_eq!(
            effects(t.store(), id).await,
            ["payments:do", "payments:undo", "stock:do", "stock:undo"],
            "crashed after commit {k}"
        );
        t.shutdown().await;
        crashed += 1;
    }
    assert!(crashed >= 4, "the order went through {crashed} commits");
}
