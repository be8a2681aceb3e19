//! The `order` saga of `examples/cross_service.rs` and its agents (shared with the
//! test that runs them on `agentsaga::testing::TestRuntime`): stock reserved, payment
//! charged (by the payments service, over NATS, in the example), the order shipped;
//! every agent records what it did in `effects`.

use agentsaga::prelude::*;
use agentsaga::saga::SagaDefinition;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::support;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Order {
    pub(crate) n: u64,
}

/// Records what it does in `effects`, in its handler's transaction. `ship` refuses
/// every fourth order (`n % 4 == 3`), for good.
pub(crate) struct Recorder(pub(crate) &'static str);

#[async_trait::async_trait]
impl Agent for Recorder {
    type Command = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        self.0
    }
    async fn handle(&self, ctx: &mut AgentContext<'_>, cmd: Value) -> Result<Value, StepError> {
        let saga = ctx
            .saga_id()
            .map(|s| s.to_string())
            .ok_or_else(|| StepError::fatal("no saga id"))?;
        if self.0 == "ship" && cmd["n"].as_u64().unwrap_or_default() % 4 == 3 {
            return Err(StepError::fatal("no address to ship to"));
        }
        let kind = if ctx.is_compensation() { "undo" } else { "do" };
        support::exec(
            ctx.conn(),
            "INSERT INTO effects (agent, saga_id, kind) VALUES (?, ?, ?)",
            &[self.0, &saga, kind],
        )
        .await?;
        Ok(json!({ "done_by": self.0 }))
    }
}

pub(crate) const DDL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS effects (agent TEXT NOT NULL, saga_id TEXT NOT NULL, kind TEXT NOT NULL)",
];

pub(crate) fn order_saga() -> anyhow::Result<SagaDefinition> {
    Ok(Saga::<Order>::builder("order", 1)
        .step(Step::new("reserve", "stock").compensate("stock", |o: &Order| json!(o.n)))
        .step(
            Step::new("charge", "payments")
                .command(|o: &Order| json!({ "n": o.n }))
                .compensate("payments", |o: &Order| json!(o.n)),
        )
        .step(
            Step::new("ship", "ship")
                .command(|o: &Order| json!({ "n": o.n }))
                .nothing_to_undo(),
        )
        .build()?)
}
