//! A handler that fails: what it did in its hop is undone, and its failure is recorded
//! once, on both backends. A handler that did nothing in its hop has its failure
//! recorded in that hop (`Hop::is_untouched`); one that wrote is rolled back first and
//! its failure recorded in a fresh hop. Either way the saga compensates, the command
//! is in the agent's inbox once, and nothing the failed handler wrote remains (the
//! second test fails if a hop that wrote is reused). That the first reuses its hop
//! (one hop, not two) shows in the saga bench's compensating figures, not here.

#[path = "support/settle.rs"]
mod settle;

use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_core::{Message, Sql, both_backends};
use agentsaga_runtime::{Agent, AgentContext, Runtime, StepError};
use agentsaga_saga::{Saga, SagaDefinition, SagaState, Step};
use serde_json::{Value, json};

/// Fails every command; first writes a row and a message in its hop if `writes`.
struct Refuses {
    writes: bool,
}

#[async_trait::async_trait]
impl Agent for Refuses {
    type Command = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        "b"
    }
    async fn handle(&self, ctx: &mut AgentContext<'_>, _: Value) -> Result<Value, StepError> {
        if self.writes {
            Sql::new("INSERT INTO b_effects (note) VALUES (?)")
                .bind("written before failing")
                .execute(ctx.conn())
                .await?;
            let note = Message::to("nobody").json(&json!({"from": "b"})).unwrap();
            ctx.tx().enqueue(&note).await?;
        }
        Err(StepError::fatal("refused"))
    }
}

/// Answers every command and undo.
struct Answers;

#[async_trait::async_trait]
impl Agent for Answers {
    type Command = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        "a"
    }
    async fn handle(&self, _: &mut AgentContext<'_>, _: Value) -> Result<Value, StepError> {
        Ok(json!("ok"))
    }
}

fn saga() -> SagaDefinition {
    Saga::<Value>::builder("refused", 1)
        .step(Step::new("a", "a").compensate("a", |_: &Value| json!("undo")))
        .pivot(Step::new("b", "b"))
        .build()
        .unwrap()
}

async fn count(rt: &Runtime, sql: &'static str) -> i64 {
    let row = Sql::new(sql).fetch_one(rt.store().reader()).await.unwrap();
    let column = row.columns()[0].clone();
    row.int(&column).unwrap()
}

async fn run(backend: Backend, writes: bool) {
    let url = fresh_url(backend).await;
    let rt = Runtime::builder()
        .database(url)
        .agent(Answers)
        .agent(Refuses { writes })
        .saga(saga())
        .start()
        .await
        .unwrap();
    let mut tx = rt.store().begin().await.unwrap();
    Sql::new("CREATE TABLE b_effects (note TEXT NOT NULL)")
        .execute(tx.conn())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(rt.start_saga("refused", &json!({"n": n})).await.unwrap());
    }
    for id in ids {
        assert_eq!(settle::settle(&rt, id).await, SagaState::Compensated);
    }
    assert_eq!(count(&rt, "SELECT count(*) FROM b_effects").await, 0);
    assert_eq!(
        count(
            &rt,
            "SELECT count(*) FROM outbox WHERE destination = 'nobody'"
        )
        .await,
        0
    );
    // Each command once in b's inbox: recorded with its failure, not twice.
    assert_eq!(
        count(&rt, "SELECT count(*) FROM inbox WHERE consumer = 'b'").await,
        5
    );
    // The failure is in the ledger of each saga's step b.
    assert_eq!(
        count(
            &rt,
            "SELECT count(*) FROM saga_steps WHERE name = 'b' AND state = 'failed'"
        )
        .await,
        5
    );
    rt.shutdown().await;
}

async fn a_failed_handler_that_did_nothing_records_its_failure_once(backend: Backend) {
    run(backend, false).await;
}
both_backends!(
    untouched,
    a_failed_handler_that_did_nothing_records_its_failure_once
);

async fn a_failed_handler_that_wrote_is_undone_then_recorded_once(backend: Backend) {
    run(backend, true).await;
}
both_backends!(
    wrote,
    a_failed_handler_that_wrote_is_undone_then_recorded_once
);
