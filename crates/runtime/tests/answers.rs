//! An agent's answer to a saga of its own process is applied to the saga in the agent's
//! transaction (`RuntimeBuilder::answers_in_agent_transaction`, on by default), on
//! both backends: the same sagas end the same way as with every answer sent through
//! the outbox, each command is processed once, and no answer becomes an outbox row.
//! When applying fails, the command is retried and its answer then goes through the
//! outbox, where the orchestrator's failure handling takes it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_core::{StoreConfig, both_backends};
use agentsaga_runtime::{Agent, AgentContext, Runtime, StepError};
use agentsaga_saga::{Saga, SagaDefinition, SagaState, Step};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    n: u32,
    #[serde(default)]
    blob: String,
}

/// Answers its command; fails step `b` fatally for odd `n`; `a` answers with
/// `blob_bytes` bytes. Counts its handler's runs.
struct Picky {
    destination: &'static str,
    blob_bytes: usize,
    runs: Arc<AtomicU32>,
}

#[async_trait::async_trait]
impl Agent for Picky {
    type Command = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        self.destination
    }
    async fn handle(&self, ctx: &mut AgentContext<'_>, cmd: Value) -> Result<Value, StepError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if ctx.is_compensation() {
            return Ok(json!("undone"));
        }
        let n = cmd["n"].as_u64().unwrap_or_default();
        if self.destination == "b" && n % 2 == 1 {
            return Err(StepError::fatal("odd orders are refused"));
        }
        Ok(json!("x".repeat(self.blob_bytes)))
    }
}

fn saga() -> SagaDefinition {
    Saga::<Order>::builder("order", 1)
        .step(
            Step::new("a", "a")
                .compensate("a", |_: &Order| json!("undo"))
                // Twice the answer: past the message limit of `outgrown` below, the
                // next step's command (the data) cannot be written.
                .on_reply(|d: &mut Order, r: String| d.blob = r.repeat(2)),
        )
        .step(Step::new("b", "b").compensate("b", |_: &Order| json!("undo")))
        .build()
        .unwrap()
}

struct Run {
    runtime: Runtime,
    runs_a: Arc<AtomicU32>,
}

async fn start(url: String, in_agent_tx: bool, blob_bytes: usize, config: StoreConfig) -> Run {
    let runs_a = Arc::new(AtomicU32::new(0));
    let runtime = Runtime::builder()
        .database(url)
        .store_config(config)
        .answers_in_agent_transaction(in_agent_tx)
        .agent(Picky {
            destination: "a",
            blob_bytes,
            runs: Arc::clone(&runs_a),
        })
        .agent(Picky {
            destination: "b",
            blob_bytes: 0,
            runs: Arc::new(AtomicU32::new(0)),
        })
        .saga(saga())
        .start()
        .await
        .unwrap();
    Run { runtime, runs_a }
}

async fn scalar(rt: &Runtime, sql: &'static str) -> i64 {
    let row = agentsaga_core::Sql::new(sql)
        .fetch_one(rt.store().reader())
        .await
        .unwrap();
    let column = row.columns()[0].clone();
    row.int(&column).unwrap()
}

/// Starts `n` sagas (orders 0..n) and waits for each; returns their end states.
async fn run_sagas(rt: &Runtime, n: u32) -> Vec<SagaState> {
    let mut ids = Vec::new();
    for i in 0..n {
        let order = Order {
            n: i,
            blob: String::new(),
        };
        ids.push(rt.start_saga("order", &order).await.unwrap());
    }
    let mut states = Vec::new();
    for id in ids {
        let state = tokio::time::timeout(Duration::from_secs(60), rt.wait(id))
            .await
            .expect("the saga settles")
            .unwrap();
        states.push(state);
    }
    states
}

// The same ten sagas (five complete, five compensate) with answers applied in the
// agents' transactions and with answers sent through the outbox: the same ends, each
// command once in the agents' inboxes; only the second has answer rows and
// orchestrator inbox records.
async fn answers_applied_in_the_agents_transaction(backend: Backend) {
    let mut ends = Vec::new();
    for in_agent_tx in [true, false] {
        let run = start(
            fresh_url(backend).await,
            in_agent_tx,
            1,
            StoreConfig::default(),
        )
        .await;
        let rt = &run.runtime;
        let states = run_sagas(rt, 10).await;
        let expected: Vec<SagaState> = (0..10)
            .map(|i| {
                if i % 2 == 0 {
                    SagaState::Completed
                } else {
                    SagaState::Compensated
                }
            })
            .collect();
        assert_eq!(states, expected, "answers in the agent's tx: {in_agent_tx}");
        // Each command once: a and b for all ten, and five undos each (a step that
        // failed is undone too: its outcome counts as unknown).
        assert_eq!(
            scalar(rt, "SELECT count(*) FROM inbox WHERE consumer = 'a'").await,
            15
        );
        assert_eq!(
            scalar(rt, "SELECT count(*) FROM inbox WHERE consumer = 'b'").await,
            15
        );
        assert_eq!(run.runs_a.load(Ordering::SeqCst), 15);
        let answers = scalar(
            rt,
            "SELECT count(*) FROM outbox WHERE destination = 'saga.order.v1'",
        )
        .await;
        let received = scalar(
            rt,
            "SELECT count(*) FROM inbox WHERE consumer = 'saga.order.v1'",
        )
        .await;
        if in_agent_tx {
            assert_eq!((answers, received), (0, 0));
        } else {
            // One answer per command: 10 + 10, and 5 + 5 undos.
            assert_eq!((answers, received), (30, 30));
        }
        ends.push(states);
        run.runtime.shutdown().await;
    }
    assert_eq!(ends[0], ends[1]);
}
both_backends!(same_ends, answers_applied_in_the_agents_transaction);

// Step a's answer makes the saga's data outgrow the message limit, so the next command
// cannot be written: applying it in the agent's transaction fails and rolls back the
// agent's work too; the retry sends the answer through the outbox, and the
// orchestrator fails the step, so the saga compensates. The command is recorded once.
async fn a_failed_application_goes_through_the_outbox(backend: Backend) {
    let config = StoreConfig::default().max_message_bytes(4096);
    let run = start(fresh_url(backend).await, true, 3000, config).await;
    let rt = &run.runtime;
    let states = run_sagas(rt, 1).await;
    assert_eq!(states, vec![SagaState::Compensated]);
    // The first run rolled back, the retry committed; then a's undo ran.
    assert_eq!(run.runs_a.load(Ordering::SeqCst), 3);
    assert_eq!(
        scalar(rt, "SELECT count(*) FROM inbox WHERE consumer = 'a'").await,
        2,
        "a's command and its undo, once each"
    );
    // The retried command's answer went through the outbox; the undo's was applied.
    assert_eq!(
        scalar(
            rt,
            "SELECT count(*) FROM outbox WHERE destination = 'saga.order.v1'"
        )
        .await,
        1
    );
    assert_eq!(
        scalar(rt, "SELECT count(*) FROM inbox WHERE consumer = 'b'").await,
        0
    );
    run.runtime.shutdown().await;
}
both_backends!(outgrown, a_failed_application_goes_through_the_outbox);
