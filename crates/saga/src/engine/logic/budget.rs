//! Budgets: what a step's reply used is added to the step and the saga (and to the
//! trees of the ancestors with budgets); once the saga's budget, or an ancestor's, is
//! spent no further forward step goes out. By the budget's option
//! the saga compensates, or holds what it would have dispatched (the next stage, a
//! step's retry) until an operator raises the budget.

use std::time::Duration;

use super::Ctx;
use crate::budget::{Budget, BudgetRecord, OnBudgetSpent, Usage};
use crate::protocol;
use crate::{Error, Result, SagaEvent, SagaState, StepState};

/// A forward dispatch a spent budget (or a pause) may hold back.
#[derive(Debug, Clone, Copy)]
pub(super) enum Dispatch {
    /// The stage after the current one.
    NextStage,
    /// Step `idx`'s command, sent again (a retry, or a lost command after the pivot).
    Again(usize),
}

impl Ctx<'_> {
    /// Adds what step `idx`'s answer used to the step and the saga. A child saga's
    /// answer carries the child's whole usage so far: the step takes what it had not
    /// seen.
    pub(super) fn record_usage(&mut self, idx: usize, usage: Usage) {
        let Some(row) = self.inst.steps.get_mut(&idx) else {
            return;
        };
        let child = crate::definition::child_of(&row.destination).is_some();
        let new = if child {
            usage.since(&row.usage)
        } else {
            usage
        };
        if new.is_zero() {
            return;
        }
        row.usage += new;
        self.inst.usage += new;
        if !child {
            // A child's usage was counted in the trees above as the child spent it.
            for s in &mut self.spenders {
                s.used += new;
            }
        }
    }

    /// May `what` go out? `false` once the saga's budget, or an ancestor's, is spent:
    /// the saga then compensates (if that budget says so and it is still before its
    /// pivot) or holds `what` until the budget is raised.
    pub(super) fn budget_allows(&mut self, what: Dispatch) -> Result<bool> {
        // A paused saga sends nothing new: held until it is resumed.
        if self.hold(what) {
            return Ok(false);
        }
        let Some((spent, on_spent)) = self.spent() else {
            return Ok(true);
        };
        let why = format!("budget spent: {spent}");
        if on_spent == OnBudgetSpent::Compensate
            && !self.past_pivot()
            && self.inst.state == SagaState::Running
        {
            self.begin_compensation(SagaEvent::Abort, why)?;
            return Ok(false);
        }
        let held = &mut self
            .inst
            .budget
            .get_or_insert_with(|| BudgetRecord {
                on_spent: OnBudgetSpent::Wait,
                ..BudgetRecord::default()
            })
            .held;
        match what {
            Dispatch::NextStage => held.next_stage = true,
            Dispatch::Again(idx) if !held.steps.contains(&idx) => held.steps.push(idx),
            Dispatch::Again(_) => {}
        }
        self.inst.error = Some(held_because(&spent));
        Ok(false)
    }

    /// An operator raises the budget (sets the limits `raise` names; a saga without a
    /// budget gets one that waits when spent). If that leaves something to spend, what
    /// was held goes out now, or, without the definition here, once the saga's
    /// orchestrator is woken by the message this sends it.
    pub(crate) fn raise_budget(&mut self, raise: Budget) -> Result<()> {
        if self.inst.state.is_terminal() {
            return Err(Error::WrongState {
                id: self.inst.id,
                action: "raise-budget",
                state: self.inst.state,
                why: ": it is finished".into(),
            });
        }
        let record = self.inst.budget.get_or_insert_with(|| BudgetRecord {
            on_spent: OnBudgetSpent::Wait,
            ..BudgetRecord::default()
        });
        record.limit = record.limit.raised_by(raise);
        if self.def.is_some() {
            return self.release_held();
        }
        if !record.held.is_empty() {
            let wake = protocol::budget_raised(self.inst.id, &self.orchestrator());
            self.fx.send.push(wake);
        }
        Ok(())
    }

    /// Sends what a spent budget held back, once the saga runs with something left to
    /// spend. A stuck saga keeps it until an operator's retry; one that turned back
    /// (or finished) needs it no more.
    pub(super) fn release_held(&mut self) -> Result<()> {
        let state = self.inst.state;
        let spent = self.spent();
        let Some(record) = &mut self.inst.budget else {
            return self.ignore("budget raised, but the saga has none");
        };
        if record.held.is_empty() {
            return self.ignore("budget raised, nothing was held back");
        }
        match state {
            SagaState::Running => {}
            SagaState::Stuck => {
                return self.ignore("held dispatches wait for a retry of the stuck saga");
            }
            _ => {
                record.held = Default::default();
                return self.ignore(format!("held dispatches dropped: the saga is {state}"));
            }
        }
        if let Some((spent, _)) = spent {
            self.inst.error = Some(held_because(&spent));
            return self.ignore(format!("budget raised, still spent: {spent}"));
        }
        let held = std::mem::take(&mut record.held);
        self.inst.error = None;
        for idx in held.steps {
            match self.inst.steps.get(&idx).map(|r| r.state) {
                Some(StepState::Dispatched) => self.dispatch_step(idx, Duration::ZERO)?,
                // Never sent: it goes as the budget has room, with its stage's others.
                None => record_of(self).pending.push(idx),
                Some(_) => {}
            }
        }
        if held.next_stage {
            self.advance_forward()
        } else {
            self.release_pending()
        }
    }

    /// Step `idx` (never sent) waits, with its stage's others, for room in the budget.
    pub(super) fn pending_for_budget(&mut self, idx: usize) {
        record_of(self).pending.push(idx);
    }

    /// Sends the current stage's steps that waited for room, as many as fit now. Once
    /// the budget is spent, they are held (or the saga compensates) as any forward
    /// dispatch is.
    pub(super) fn release_pending(&mut self) -> Result<()> {
        let Some(record) = &mut self.inst.budget else {
            return Ok(());
        };
        if record.pending.is_empty() || self.inst.state != SagaState::Running {
            return Ok(());
        }
        let pending = std::mem::take(&mut record.pending);
        let mut rest = Vec::new();
        for idx in pending {
            if !rest.is_empty() {
                rest.push(idx);
            } else if self.spent().is_some() {
                if !self.budget_allows(Dispatch::Again(idx))?
                    && self.inst.state != SagaState::Running
                {
                    return Ok(()); // it compensates: nothing more goes forward
                }
            } else if self.room_for_one() {
                self.dispatch_step(idx, Duration::ZERO)?;
            } else {
                rest.push(idx);
            }
        }
        record_of(self).pending = rest;
        Ok(())
    }

    /// Why the saga's budget, or an ancestor's (what its whole tree used), is spent,
    /// if one is, and what to do then.
    pub(super) fn spent(&self) -> Option<(String, OnBudgetSpent)> {
        self.spent_with(Usage::default())
    }

    /// [`spent`](Self::spent), counting `ahead` more for the saga and its ancestors.
    fn spent_with(&self, ahead: Usage) -> Option<(String, OnBudgetSpent)> {
        let own = self.inst.budget.as_ref().and_then(|r| {
            r.limit
                .spent_by(&(self.inst.usage + ahead))
                .map(|why| (why, r.on_spent))
        });
        own.or_else(|| {
            self.spenders.iter().find_map(|s| {
                s.limit.spent_by(&(s.used + ahead)).map(|why| {
                    let whose = if s.id == self.inst.id {
                        "with its child sagas".to_owned()
                    } else {
                        format!("by the tree of saga {}", s.id)
                    };
                    (format!("{why} ({whose})"), s.on_spent)
                })
            })
        })
    }

    /// Is there room in the budget for one more forward step beside those on their
    /// way? Each step on its way is expected to use one outside call and, of tokens
    /// and cost, what the saga's answered steps used on average; with none on its way,
    /// there is room unless the budget is spent. So a stage goes out as far as it fits,
    /// and a budget is exceeded by at most what the steps on their way use beyond
    /// that.
    pub(super) fn room_for_one(&self) -> bool {
        if self.inst.budget.is_none() && self.spenders.is_empty() {
            return true;
        }
        let rows = self.inst.steps.values();
        let on_their_way = rows
            .clone()
            .filter(|r| r.state == StepState::Dispatched)
            .count() as u64;
        let answered = rows.filter(|r| r.replied_at.is_some()).count() as u64;
        let used = self.inst.usage;
        let each = |total: u64| total.checked_div(answered).unwrap_or(0);
        let expected = Usage {
            tokens_in: each(used.tokens_in),
            tokens_out: each(used.tokens_out),
            cost_micros: each(used.cost_micros),
            calls: each(used.calls).max(1),
        };
        let times = |n: u64| n.saturating_mul(on_their_way);
        let ahead = Usage {
            tokens_in: times(expected.tokens_in),
            tokens_out: times(expected.tokens_out),
            cost_micros: times(expected.cost_micros),
            calls: times(expected.calls),
        };
        self.spent_with(ahead).is_none()
    }
}

fn record_of<'a>(ctx: &'a mut Ctx<'_>) -> &'a mut BudgetRecord {
    ctx.inst.budget.get_or_insert_with(BudgetRecord::default)
}

/// The saga's error while a spent budget holds what it would send.
fn held_because(spent: &str) -> String {
    format!("budget spent: {spent}: waiting for an operator to raise it")
}
