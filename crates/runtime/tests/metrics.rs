//! The metrics endpoint serves the documented series, with values that match the
//! database.

#[path = "support/scrape.rs"]
mod scrape;

use std::collections::HashMap;
use std::time::Duration;

use agentsaga_core::testing::{backends, fresh_url, wait_until};
use agentsaga_runtime::{Agent, AgentContext, Runtime, StepError};
use agentsaga_saga::{Saga, SagaState, Step, Usage, query};
use scrape::scrape;
use serde_json::{Value, json};

struct Flaky;

#[async_trait::async_trait]
impl Agent for Flaky {
    type Command = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        "flaky"
    }
    async fn handle(&self, ctx: &mut AgentContext<'_>, cmd: Value) -> Result<Value, StepError> {
        if !ctx.is_compensation() {
            // What a model call would use: 10 tokens in, 20 out; an undo uses nothing.
            ctx.report_usage(Usage::tokens(10, 20));
        }
        if !ctx.is_compensation() && cmd["n"].as_u64().unwrap_or(0).is_multiple_of(3) {
            return Err(StepError::fatal("every third one fails"));
        }
        Ok(cmd)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_database() {
    let saga = Saga::<Value>::builder("m", 1)
        .step(Step::new("a", "flaky").compensate("flaky", |_: &Value| json!("undo")))
        .build()
        .unwrap();
    let runtime = Runtime::builder()
        .database(fresh_url(backends()[0]).await)
        .agent(Flaky)
        .saga(saga)
        .metrics("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .unwrap();
    let addr = runtime.metrics_addr().unwrap();
    assert!(addr.ip().is_loopback());
    let mut ids = Vec::new();
    for n in 0..9 {
        ids.push(runtime.start_saga("m", &json!({ "n": n })).await.unwrap());
    }
    for id in ids {
        tokio::time::timeout(Duration::from_secs(30), runtime.wait(id))
            .await
            .unwrap()
            .unwrap();
    }
    // Sagas settle before their last messages are acknowledged, and the relay counts an
    // acknowledgement just after the database has it: wait until nothing moves (the
    // outbox drained and every delivered row counted), so the database and the scrape
    // describe the same moment.
    let mut stats = None;
    wait_until("the outbox drains", Duration::from_secs(30), async || {
        let s = runtime.store().admin().stats().await.unwrap();
        let counted = runtime.relay_stats().unwrap().delivered;
        let drained = s.in_flight == 0 && s.oldest_pending_age_ms.is_none();
        let done = drained && counted == s.delivered;
        stats = Some(s);
        done
    })
    .await;
    let stats = stats.expect("looked at the outbox");
    runtime.sample_metrics().await;
    let m = tokio::task::spawn_blocking(move || scrape(addr))
        .await
        .unwrap();

    assert_eq!(m["agentsaga_outbox_pending"], stats.pending as f64);
    assert_eq!(m["agentsaga_outbox_in_flight"], stats.in_flight as f64);
    assert_eq!(m["agentsaga_outbox_dead"], stats.dead as f64);
    assert!(m.contains_key("agentsaga_outbox_lag_seconds"));
    let counts: HashMap<SagaState, u64> = query::count_by_state(runtime.store())
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(counts[&SagaState::Completed], 6);
    assert_eq!(counts[&SagaState::Compensated], 3);
    for (state, n) in &counts {
        assert_eq!(
            m[&format!("agentsaga_sagas{{state=\"{state}\"}}")],
            *n as f64,
            "{state}"
        );
    }
    assert_eq!(m["agentsaga_sagas{state=\"stuck\"}"], 0.0);
    let relay = runtime.relay_stats().unwrap();
    assert_eq!(m["agentsaga_deliveries_total"], relay.delivered as f64);
    // Commands and undos go through the outbox; their replies are applied to the
    // sagas in the agents' transactions (`answers_in_agent_transaction`).
    assert!(relay.delivered >= 9 + 3, "commands and undos: {relay:?}");
    assert!(
        m.contains_key("agentsaga_retries_total") && m.contains_key("agentsaga_dead_letters_total")
    );
    assert!(
        m.contains_key("agentsaga_delivery_latency_seconds{quantile=\"0.99\"}"),
        "{m:?}"
    );
    assert_eq!(m["agentsaga_saga_duration_seconds_count"], 9.0, "{m:?}");
    // Every finished saga's usage, by name and kind; a kind none used is absent.
    assert_eq!(
        m["agentsaga_saga_usage_total{saga=\"m\",kind=\"tokens_in\"}"], 90.0,
        "{m:?}"
    );
    assert_eq!(
        m["agentsaga_saga_usage_total{saga=\"m\",kind=\"tokens_out\"}"], 180.0,
        "{m:?}"
    );
    assert!(
        !m.contains_key("agentsaga_saga_usage_total{saga=\"m\",kind=\"calls\"}"),
        "{m:?}"
    );
    runtime.shutdown().await;
}
