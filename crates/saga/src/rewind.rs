//! An operator's rewind of a saga to one of its steps: [`Rewind`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::CompensationState;

/// One rewind of a saga to step `to` (`Engine::rewind`): `to` and every step done
/// after it are undone, latest first, each by its compensation as the ledger recorded
/// it; then the saga runs forward again from `to`'s stage, with its data as it was
/// when that stage began. A saga keeps its rewinds (`saga_instances.rewinds`): the one
/// under way (`done_ms` is `None`) and those done, each with the steps it undid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rewind {
    /// The step rewound to.
    pub to: String,
    /// Its stage, from which the saga runs forward again.
    pub stage: usize,
    /// Who rewound it (an operator's name, `console`).
    pub by: String,
    /// Why.
    pub reason: String,
    /// When it was asked, Unix ms.
    pub at_ms: i64,
    /// When the last of its undos was done and the saga turned forward again, Unix ms
    /// (`None` while it is under way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_ms: Option<i64>,
    /// Why it was given up before it was done (the saga's deadline passed, or its
    /// parent turned back, while its undos ran): the saga then undoes every step it
    /// took, as any saga that turns back, and does not run forward again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abandoned: Option<String>,
    /// The steps it undid, as the ledger had them then (filled in once it is done).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub undone: Vec<UndoneStep>,
}

/// A step a [`Rewind`] undid: its ledger entry as it was when the saga turned forward
/// again (its row is then written afresh by the step's next run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UndoneStep {
    /// The step's index.
    pub idx: usize,
    /// Its name.
    pub name: String,
    /// What its agent answered (the answer the rewind went back on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Its compensation's end: done, skipped by an operator, or not needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<CompensationState>,
    /// When its compensation was done, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensated_at: Option<i64>,
}
