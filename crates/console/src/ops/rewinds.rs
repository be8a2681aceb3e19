//! A saga's rewinds, as its document shows them: who rewound it to which step, why and
//! when, whether the rewind is done, and the steps it undid.

use agentsaga_saga::{Rewind, UndoneStep};
use serde::Serialize;
use serde_json::Value;

use crate::time::rfc3339;

/// One rewind of a saga (`sagas rewind`): a [`ShowDoc`](super::ShowDoc)'s `rewinds`,
/// oldest first. The step `to` and every step done after it were undone (latest first,
/// by their compensations), then the saga ran forward again from `to`'s stage with its
/// data as that stage began.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RewindDoc {
    /// The step rewound to.
    pub to: String,
    /// Its stage, from which the saga runs forward again.
    pub stage: usize,
    /// Who rewound it (an operator's name, `console`).
    pub by: String,
    /// Why.
    pub reason: String,
    /// When it was asked.
    pub at: String,
    /// When it was asked, Unix ms.
    pub at_ms: i64,
    /// When its last undo was done and the saga turned forward again; `None` while it
    /// is under way.
    pub done_at: Option<String>,
    /// The same, Unix ms.
    pub done_at_ms: Option<i64>,
    /// The steps it undid, latest first, as the ledger had them then (empty while it is
    /// under way).
    pub undone: Vec<UndoneDoc>,
}

impl RewindDoc {
    /// Whether its undos are still going on.
    pub fn under_way(&self) -> bool {
        self.done_at_ms.is_none()
    }
}

impl From<&Rewind> for RewindDoc {
    fn from(r: &Rewind) -> Self {
        Self {
            to: r.to.clone(),
            stage: r.stage,
            by: r.by.clone(),
            reason: r.reason.clone(),
            at: rfc3339(r.at_ms),
            at_ms: r.at_ms,
            done_at: r.done_ms.map(rfc3339),
            done_at_ms: r.done_ms,
            undone: r.undone.iter().map(UndoneDoc::from).collect(),
        }
    }
}

/// A step a rewind undid: a [`RewindDoc`]'s `undone`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UndoneDoc {
    /// The step's index.
    pub idx: usize,
    /// Its name.
    pub name: String,
    /// What its agent had answered (the answer the rewind went back on).
    pub output: Option<Value>,
    /// How its compensation ended: `done`, `skipped` (by an operator), `not_needed`.
    pub compensation: Option<String>,
    /// When its compensation was done.
    pub compensated_at: Option<String>,
    /// The same, Unix ms.
    pub compensated_at_ms: Option<i64>,
}

impl From<&UndoneStep> for UndoneDoc {
    fn from(u: &UndoneStep) -> Self {
        Self {
            idx: u.idx,
            name: u.name.clone(),
            output: u.output.clone(),
            compensation: u.compensation.map(|c| c.to_string()),
            compensated_at: u.compensated_at.map(rfc3339),
            compensated_at_ms: u.compensated_at,
        }
    }
}
