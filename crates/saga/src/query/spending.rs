//! What a saga spent and may spend: its [`Usage`] and its [`Budget`].

use agentsaga_core::{Sql, Store};
use serde::Serialize;

use crate::budget::BudgetRecord;
use crate::{Budget, OnBudgetSpent, Result, SagaId, Usage};

/// A saga's usage and budget, as operators see them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Spending {
    /// What its steps (and child sagas) used, as their agents reported it.
    pub usage: Usage,
    /// Its limits, if it has a budget.
    pub budget: Option<Budget>,
    /// What it does once the budget is spent (with a budget).
    pub on_spent: Option<OnBudgetSpent>,
    /// Why it is held back, if its budget is spent and it waits for a raise.
    pub spent: Option<String>,
    /// Is it waiting for an operator to raise its budget (forward dispatches held)?
    pub waiting_for_raise: bool,
}

/// Saga `id`'s [`Spending`]; `None` for an unknown saga.
///
/// # Errors
/// Store errors; [`crate::Error::Data`] for a column that is not what this engine
/// writes.
pub async fn spending(store: &Store, id: SagaId) -> Result<Option<Spending>> {
    let row = Sql::new("SELECT usage, budget, state FROM saga_instances WHERE id = ?")
        .bind(*id.as_uuid())
        .fetch_optional(store.reader())
        .await?
        .map(|r| -> agentsaga_core::Result<_> {
            Ok((
                r.opt_text("usage")?,
                r.opt_text("budget")?,
                r.text("state")?,
            ))
        })
        .transpose()?;
    let Some((usage, budget, state)) = row else {
        return Ok(None);
    };
    let usage: Usage = usage
        .map(|u| serde_json::from_str(&u))
        .transpose()?
        .unwrap_or_default();
    let record: Option<BudgetRecord> = budget.map(|b| serde_json::from_str(&b)).transpose()?;
    Ok(Some(Spending {
        usage,
        spent: record.as_ref().and_then(|r| r.limit.spent_by(&usage)),
        // Held dispatches matter while it runs (or is stuck, until a retry).
        waiting_for_raise: matches!(state.as_str(), "running" | "stuck")
            && record.as_ref().is_some_and(|r| !r.held.is_empty()),
        budget: record.as_ref().map(|r| r.limit),
        on_spent: record.map(|r| r.on_spent),
    }))
}
