//! A database-only agent that answers at once with its command: the fast agent of the
//! runtime's tests.

use agentsaga_runtime::{Agent, AgentContext, StepError};
use serde_json::Value;

/// Consumes the destination it is given; replies with its command.
pub(crate) struct Echo(pub(crate) &'static str);

#[async_trait::async_trait]
impl Agent for Echo {
    type Command = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        self.0
    }
    async fn handle(&self, _: &mut AgentContext<'_>, cmd: Value) -> Result<Value, StepError> {
        Ok(cmd)
    }
}
