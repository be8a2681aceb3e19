//! A saga message the orchestrator cannot process reaches its saga instead of leaving
//! it `running` forever: before the pivot the saga compensates, after it the saga is
//! stuck, with the reason. On both backends.

use std::time::Duration;

use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_core::{RetryPolicy, StoreConfig, both_backends};
use agentsaga_relay::RelayConfig;
use agentsaga_runtime::{Agent, AgentContext, Runtime, StepError};
use agentsaga_saga::{Saga, SagaState, Step, query};
use serde_json::{Value, json};

/// Answers every command with 900 bytes of text; undoes anything.
struct Verbose;

#[async_trait::async_trait]
impl Agent for Verbose {
    type Command = Value;
    type Reply = String;
    fn destination(&self) -> &str {
        "verbose"
    }
    async fn handle(&self, _: &mut AgentContext<'_>, _: Value) -> Result<String, StepError> {
        Ok("x".repeat(900))
    }
}

/// Each reply is folded into the data, and each command carries the whole data: the
/// third command (two replies, ~2 kB) would be over the store's 1,400-byte message
/// limit.
fn step(name: &str) -> Step<Value> {
    Step::new(name, "verbose")
        .on_reply(|d: &mut Value, r: String| d["notes"].as_array_mut().unwrap().push(r.into()))
        .retry(RetryPolicy::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
            3,
        ))
}

async fn run(backend: Backend, pivot_first: bool) -> (SagaState, String) {
    let undo = |name: &str| step(name).compensate("verbose", |_: &Value| json!("undo"));
    let saga = if pivot_first {
        Saga::<Value>::builder("grows", 1)
            .pivot(step("a"))
            .step(step("b"))
            .step(step("c"))
            .build()
            .unwrap()
    } else {
        Saga::<Value>::builder("grows", 1)
            .step(undo("a"))
            .step(undo("b"))
            .step(undo("c"))
            .build()
            .unwrap()
    };
    let rt = Runtime::builder()
        .database(fresh_url(backend).await)
        .store_config(StoreConfig::default().max_message_bytes(1400))
        .relay_config(RelayConfig::default().retry(RetryPolicy::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
            3,
        )))
        .agent(Verbose)
        .saga(saga)
        .start()
        .await
        .unwrap();
    let id = rt.start_saga("grows", &json!({"notes": []})).await.unwrap();
    let state = tokio::time::timeout(Duration::from_secs(60), rt.wait(id))
        .await
        .expect("the saga settles instead of stalling")
        .unwrap();
    let error = query::get(rt.store(), id)
        .await
        .unwrap()
        .unwrap()
        .error
        .unwrap_or_default();
    assert_eq!(
        rt.store().admin().stats().await.unwrap().dead,
        0,
        "nothing dead-lettered"
    );
    rt.shutdown().await;
    (state, error)
}

async fn data_outgrowing_the_limit_compensates(backend: Backend) {
    let (state, error) = run(backend, false).await;
    assert_eq!(state, SagaState::Compensated, "{error}");
    assert!(error.contains("over the limit"), "{error}");
    assert!(error.contains("could not go on"), "{error}");
}
both_backends!(before_pivot_tests, data_outgrowing_the_limit_compensates);

async fn data_outgrowing_the_limit_after_the_pivot_is_stuck(backend: Backend) {
    let (state, error) = run(backend, true).await;
    assert_eq!(state, SagaState::Stuck, "{error}");
    assert!(error.contains("over the limit"), "{error}");
}
both_backends!(
    after_pivot_tests,
    data_outgrowing_the_limit_after_the_pivot_is_stuck
);
