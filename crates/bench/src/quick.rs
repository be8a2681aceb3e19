//! What the benches of the runtime share: an agent that answers at once, and the saga
//! of two undoable steps then the pivot.

use agentsaga_runtime::{Agent, AgentContext, StepError};
use agentsaga_saga::{Saga, SagaDefinition, Step};
use serde_json::Value;

/// A database-only agent that answers at once and writes nothing of its own.
pub(crate) struct QuickAgent {
    pub(crate) destination: &'static str,
    /// Its answers to a command and to a compensation.
    pub(crate) answers: (&'static str, &'static str),
    /// Whether it refuses (fatally: `declined`) a command, from its destination and the
    /// command; never a compensation.
    pub(crate) refuses: fn(&str, &Value) -> bool,
}

#[async_trait::async_trait]
impl Agent for QuickAgent {
    type Command = Value;
    type Reply = &'static str;

    fn destination(&self) -> &str {
        self.destination
    }

    async fn handle(
        &self,
        ctx: &mut AgentContext<'_>,
        command: Value,
    ) -> Result<&'static str, StepError> {
        if ctx.is_compensation() {
            return Ok(self.answers.1);
        }
        if (self.refuses)(self.destination, &command) {
            return Err(StepError::fatal("declined"));
        }
        Ok(self.answers.0)
    }
}

/// The saga `name` of the runtime side of the saga and agents benches: the steps
/// `steps` (name, agent), the first two undone with `undo` of the data, the third the
/// pivot.
pub(crate) fn two_then_pivot<D>(
    name: &str,
    steps: [(&str, &'static str); 3],
    undo: fn(&D) -> u64,
) -> anyhow::Result<SagaDefinition>
where
    D: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let [(a, agent_a), (b, agent_b), (c, agent_c)] = steps;
    Ok(Saga::<D>::builder(name, 1)
        .step(Step::new(a, agent_a).compensate(agent_a, undo))
        .step(Step::new(b, agent_b).compensate(agent_b, undo))
        .pivot(Step::new(c, agent_c))
        .build()?)
}
