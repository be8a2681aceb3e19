//! A step that waits for a signal instead of sending a command, and who may send it.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::step::{Step, StepDef, Undo};

impl<D, U> Step<D, U>
where
    D: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// A step that waits for the signal `name` (a person's approval, an outside event)
    /// instead of sending a command: the saga parks there, holding nothing, until
    /// `Runtime::signal(id, name, …)` (or `agentsaga sagas signal`) sends it. An
    /// approval's payload folds into the data through [`on_reply`](Step::on_reply); a
    /// rejection fails the step (before the pivot the saga compensates, at or after it
    /// the saga is stuck), and so does its [`timeout`](Step::timeout), counted from
    /// when the saga reaches the wait. A signal sent before the saga gets there is kept
    /// and used when it does. A wait has nothing to undo, so it stands before the pivot
    /// or after it as it is.
    ///
    /// A wait is a **person's decision** unless it says otherwise
    /// ([`agents_may_signal`](Self::agents_may_signal)): its signal is taken from the
    /// application's own code (`Runtime::signal`), `agentsaga sagas signal` and the
    /// console's API and page, never from an LLM-facing surface (the MCP tools),
    /// whatever that is allowed ([`Engine::signal_by`](crate::Engine::signal_by) with
    /// [`SignalSender::Agent`](crate::SignalSender::Agent) is refused). The safe choice
    /// needs no remembering.
    pub fn wait_for(name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            def: StepDef {
                command: Arc::new(|_: &Value| Ok(Value::Null)),
                undo: Undo::Nothing,
                wait: Some(name.clone()),
                approval: true,
                ..StepDef::new(name.clone(), format!("signal:{name}"))
            },
            _marker: PhantomData,
        }
    }

    /// A wait for the signal `name` that only a person may send: the same as
    /// [`wait_for`](Self::wait_for) (every wait is a person's decision unless it says
    /// otherwise), named for the reader.
    pub fn approval(name: impl Into<String>) -> Self {
        Self::wait_for(name)
    }

    /// This wait's signal may also come from an agent, an LLM-facing surface included
    /// (`agentsaga mcp --allow signal`): for an outside event (a webhook, a reply),
    /// never for a person's decision. Only a wait has a signal; on any other step this
    /// changes nothing.
    pub fn agents_may_signal(mut self) -> Self {
        self.def.approval = false;
        self
    }
}
