//! A handler that never returns while it holds its hop (its turn in a shared
//! transaction) does not stall the process: past `StoreConfig::hop_timeout` it is
//! dropped, its hop undone, and its delivery retried, while every other saga goes on.
//! On SQLite, before the watchdog, every write of the process waited behind it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_core::{RetryPolicy, StoreConfig, both_backends};
use agentsaga_relay::RelayConfig;
use agentsaga_runtime::{Agent, AgentContext, Runtime, StepError};
use agentsaga_saga::{Saga, SagaState, Step};
use echo::Echo;
use serde_json::{Value, json};

#[path = "support/echo.rs"]
mod echo;

/// Its first command never comes back (it holds its hop forever); later ones answer.
struct Hangs(Arc<AtomicU32>);

#[async_trait::async_trait]
impl Agent for Hangs {
    type Command = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        "hangs"
    }
    async fn handle(&self, _: &mut AgentContext<'_>, cmd: Value) -> Result<Value, StepError> {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            std::future::pending::<()>().await;
        }
        Ok(cmd)
    }
}

async fn a_handler_that_never_returns_stalls_nothing(backend: Backend) {
    let calls = Arc::new(AtomicU32::new(0));
    let stuck = Saga::<Value>::builder("stuck", 1)
        .step(Step::new("h", "hangs").nothing_to_undo())
        .build()
        .unwrap();
    let fast = Saga::<Value>::builder("fast", 1)
        .step(Step::new("a", "a").compensate("a", |_: &Value| json!("undo")))
        .build()
        .unwrap();
    let rt = Runtime::builder()
        .database(fresh_url(backend).await)
        .store_config(StoreConfig::default().hop_timeout(Duration::from_millis(300)))
        .relay_config(RelayConfig::default().retry(RetryPolicy::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
            5,
        )))
        .agent(Hangs(Arc::clone(&calls)))
        .agent(Echo("a"))
        .saga(stuck)
        .saga(fast)
        .start()
        .await
        .unwrap();
    let hung = rt.start_saga("stuck", &json!({"n": 0})).await.unwrap();
    agentsaga_core::testing::wait_until("the handler hangs", Duration::from_secs(30), async || {
        calls.load(Ordering::SeqCst) >= 1
    })
    .await;
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(rt.start_saga("fast", &json!({ "n": n })).await.unwrap());
    }
    for id in ids {
        let state = tokio::time::timeout(Duration::from_secs(60), rt.wait(id))
            .await
            .expect("the other sagas go on")
            .unwrap();
        assert_eq!(state, SagaState::Completed);
    }
    // The hung delivery was dropped and retried: its second delivery answers.
    let state = tokio::time::timeout(Duration::from_secs(60), rt.wait(hung))
        .await
        .expect("the hung saga settles")
        .unwrap();
    assert_eq!(state, SagaState::Completed);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    rt.shutdown().await;
}
both_backends!(watchdog_tests, a_handler_that_never_returns_stalls_nothing);
