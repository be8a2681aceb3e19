//! The in-memory image of one saga instance and its steps, loaded and saved whole in
//! the transaction that advances it.

use std::collections::BTreeMap;

use agentsaga_core::MessageId;
use serde_json::Value;

use crate::budget::{Budget, BudgetRecord, OnBudgetSpent, Usage};
use crate::{CompensationState, SagaId, SagaState, StepState};

/// A saga instance as stored in `saga_instances`, with its `saga_steps`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Instance {
    pub(crate) id: SagaId,
    pub(crate) name: String,
    pub(crate) version: i32,
    pub(crate) state: SagaState,
    pub(crate) data: Value,
    pub(crate) error: Option<String>,
    pub(crate) stage: usize,
    pub(crate) steps: BTreeMap<usize, StepRow>,
    pub(crate) finished: bool,
    /// The saga whose step this one is (a child saga), `None` for a saga started on
    /// its own.
    pub(crate) parent: Option<ParentLink>,
    /// What its steps used, as their agents reported it (`saga_instances.usage`).
    pub(crate) usage: Usage,
    /// Its budget, if it has one (`saga_instances.budget`).
    pub(crate) budget: Option<BudgetRecord>,
    /// An operator's pause, and what it held back (`saga_instances.pause`).
    pub(crate) pause: Option<PauseRecord>,
    /// Its rewinds (`saga_instances.rewinds`): the one under way last, if any.
    pub(crate) rewinds: Vec<crate::Rewind>,
    /// The W3C trace context of its `saga.start` span (`saga_instances.trace_parent`),
    /// captured at its start and written then only (a loaded instance has `None`):
    /// what a signal or an operator's act continues the saga's trace from.
    pub(crate) trace: Option<String>,
}

/// A child saga's link to the step of its parent that started it
/// (`saga_instances.parent`, JSON): what its answers to the parent are addressed with.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ParentLink {
    /// The parent saga.
    pub(crate) saga: SagaId,
    /// The parent's step (its index) and that step's name.
    pub(crate) step: usize,
    pub(crate) step_name: String,
    /// The parent's orchestrator destination, where the answers go.
    pub(crate) reply_to: String,
    /// The parent's command that started this child (the latest, if sent again): the
    /// outcome answers it.
    pub(crate) command: MessageId,
    /// The parent's compensation of its step, once sent: answered once this child is
    /// undone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) compensation: Option<MessageId>,
    /// 1 for a child of a saga started on its own, 2 for its child, ...
    pub(crate) depth: u32,
}

/// An operator's pause of a saga (`saga_instances.pause`, JSON), and what the saga held
/// back while paused: sent once it is resumed. `paused` is `None` between a resume by a
/// process without the saga's definition and its orchestrator's release of the rest.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct PauseRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) paused: Option<crate::Paused>,
    /// The next stage waits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) next_stage: bool,
    /// Steps to send again (a retry, a resend past the pivot), or never sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) steps: Vec<usize>,
    /// Compensations to send.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) compensations: Vec<usize>,
    /// A stage to send afresh (a rewind's, once its undos are done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) stage: Option<usize>,
}

/// One `saga_steps` row: the forward step and its compensation-ledger entry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepRow {
    pub(crate) idx: usize,
    pub(crate) stage: usize,
    pub(crate) name: String,
    pub(crate) destination: String,
    pub(crate) state: StepState,
    pub(crate) attempts: u32,
    pub(crate) command_id: Option<MessageId>,
    pub(crate) timer_id: Option<MessageId>,
    pub(crate) input: Option<Value>,
    pub(crate) output: Option<Value>,
    pub(crate) error: Option<String>,
    pub(crate) compensation_destination: Option<String>,
    pub(crate) compensation_payload: Option<Value>,
    pub(crate) compensation_state: Option<CompensationState>,
    pub(crate) compensation_attempts: u32,
    pub(crate) compensation_message_id: Option<MessageId>,
    pub(crate) compensation_error: Option<String>,
    pub(crate) deadline_ms: Option<i64>,
    pub(crate) dispatched_at: Option<i64>,
    pub(crate) replied_at: Option<i64>,
    pub(crate) compensated_at: Option<i64>,
    /// What its attempts and its compensation used (`saga_steps.usage`).
    pub(crate) usage: Usage,
    /// The saga's data as the step's stage began, on the stage's first step only
    /// (`saga_steps.data_before`): what a rewind to the stage restores. Kept as the
    /// JSON text it is stored as: only a rewind decodes it.
    pub(crate) data_before: Option<String>,
}

impl StepRow {
    /// The row a step gets at its first dispatch: nothing sent yet, and its
    /// compensation-ledger entry as given.
    pub(crate) fn first_dispatch(
        idx: usize,
        stage: usize,
        name: &str,
        destination: &str,
        compensation_state: Option<CompensationState>,
        compensation_destination: Option<String>,
        compensation_payload: Option<Value>,
    ) -> Self {
        Self {
            idx,
            stage,
            name: name.to_owned(),
            destination: destination.to_owned(),
            state: StepState::Dispatched,
            attempts: 0,
            command_id: None,
            timer_id: None,
            input: None,
            output: None,
            error: None,
            compensation_destination,
            compensation_payload,
            compensation_state,
            compensation_attempts: 0,
            compensation_message_id: None,
            compensation_error: None,
            deadline_ms: None,
            dispatched_at: None,
            replied_at: None,
            compensated_at: None,
            usage: Usage::default(),
            data_before: None,
        }
    }
}

impl StepRow {
    /// With the saga's data as its stage began (for a stage's first step).
    pub(crate) fn with_data_before(mut self, data: Option<String>) -> Self {
        self.data_before = data;
        self
    }
}

impl Instance {
    /// A new instance `id` of saga `name`, running, with `data` and nothing done yet;
    /// `parent`: the parent step of a child saga.
    pub(crate) fn new(
        id: SagaId,
        name: &str,
        version: i32,
        data: Value,
        parent: Option<ParentLink>,
    ) -> Self {
        Self {
            id,
            name: name.to_owned(),
            version,
            state: SagaState::Running,
            data,
            error: None,
            stage: 0,
            steps: BTreeMap::new(),
            finished: false,
            parent,
            usage: Usage::default(),
            budget: None,
            pause: None,
            rewinds: Vec::new(),
            trace: None,
        }
    }

    /// The rewind under way, if any.
    pub(crate) fn rewinding(&self) -> Option<&crate::Rewind> {
        self.rewinds
            .last()
            .filter(|r| r.done_ms.is_none() && r.abandoned.is_none())
    }

    /// Has a compensation exhausted its retries (the saga is stuck going backward)?
    pub(crate) fn failed_compensation(&self) -> Option<usize> {
        self.steps
            .values()
            .find(|r| r.compensation_state == Some(CompensationState::Failed))
            .map(|r| r.idx)
    }
}

/// An ancestor of the saga (or the saga itself, when it has children) with a budget:
/// what its whole tree of sagas has used, read when the event's handling began, and
/// what is added while deciding. A child's spending counts against it as it happens.
#[derive(Debug, Clone)]
pub(crate) struct Spender {
    pub(crate) id: crate::SagaId,
    pub(crate) limit: Budget,
    pub(crate) on_spent: OnBudgetSpent,
    pub(crate) used: Usage,
}
