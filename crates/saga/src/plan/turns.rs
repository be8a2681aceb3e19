//! Re-planning (`PlannedBuilder::replan`): a planner that extends its plan as it goes.
//! Its first turn answers with the plan; once the stages a turn added have run, the
//! planner is asked again, with the results so far, and answers with the next stages
//! or `{"done": true}`, up to the saga's most turns.
//!
//! The saga data keeps the plan of every turn so far, concatenated, at `/plan`, and how
//! many stages each turn added at `/turns` (`/done` once the planner said so). The
//! saga's stages are made from them: the planner, the first turn's stages, the planner
//! again (its step named `<planner>_2`), the second turn's, and so on, then the next
//! turn's planner while turns remain. Stages that ran never change: a turn only
//! appends, so every step keeps its index, and compensation undoes the steps of every
//! turn, latest first, like those of one plan.

use serde_json::Value;

use super::catalog::{Catalog, Planned, is_turn_name, turn_name};
use super::{Plan, candidates, set};
use crate::definition::step::StepDef;
use crate::{Error, Result};

/// How many stages each turn of the planner added, and whether it said it is done.
pub(super) struct Turns {
    pub(super) added: Vec<usize>,
    pub(super) done: bool,
    /// The most turns, as the saga was started under (`None`: as registered now).
    pub(super) max: Option<u32>,
    /// Asked again only after a failure (`PlannedBuilder::replan_on_failure`), as the
    /// saga was started under (`None`: as registered now).
    pub(super) on_failure: Option<bool>,
    /// A failure waits for the planner's next turn (`/failed`).
    pub(super) recovering: bool,
}

impl Turns {
    /// The turns recorded in a planned saga's `data`. A plan stored without `/turns`
    /// (a saga started before re-planning) is one turn.
    pub(super) fn of(data: &Value, plan: Option<&Plan>) -> Self {
        let added = match data.get("turns").and_then(Value::as_array) {
            Some(turns) => turns
                .iter()
                .map(|n| n.as_u64().map_or(0, |n| n as usize))
                .collect(),
            None => plan.map(|p| vec![p.steps.len()]).unwrap_or_default(),
        };
        let done = data.get("done").and_then(Value::as_bool) == Some(true);
        let max = data
            .get("max_turns")
            .and_then(Value::as_u64)
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        let on_failure = data.get("replan_on_failure").and_then(Value::as_bool);
        Self {
            added,
            done,
            max,
            on_failure,
            recovering: recovering(data),
        }
    }
}

/// Does a failure wait for the planner's next turn (`/failed` holds it)?
pub(crate) fn recovering(data: &Value) -> bool {
    data.get("failed")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

impl Planned {
    /// The planner's step of turn `turn`, if the saga has a planner.
    pub(super) fn turn_step(&self, turn: usize) -> Option<StepDef> {
        let mut step = self.planner.clone()?;
        step.name = turn_name(&step.name, turn);
        Some(step)
    }

    /// Is `name` the name of one of its planner's turns?
    pub(crate) fn is_turn(&self, name: &str) -> bool {
        self.planner
            .as_ref()
            .is_some_and(|p| is_turn_name(&p.name, name))
    }

    /// `plan_stages` (the stages of the stored plan, in order) laid out by turn: each
    /// turn's planner step, then the stages it added; then the next turn's planner, if
    /// the planner is not done and turns remain.
    pub(super) fn by_turn(
        &self,
        turns: &Turns,
        plan_stages: Vec<Vec<StepDef>>,
    ) -> Vec<Vec<StepDef>> {
        let mut stages = Vec::new();
        let mut plan_stages = plan_stages.into_iter();
        for (turn, added) in turns.added.iter().enumerate() {
            stages.extend(self.turn_step(turn).map(|s| vec![s]));
            stages.extend(plan_stages.by_ref().take(*added));
        }
        stages.extend(plan_stages);
        let on_failure = turns.on_failure.unwrap_or(self.catalog.replan_on_failure);
        // The first turn makes the plan; after it, with `replan_on_failure`, only a
        // failure asks again.
        let ask = turns.added.is_empty() || !on_failure || turns.recovering;
        if self.turns_left(turns) && ask {
            stages.extend(self.turn_step(turns.added.len()).map(|s| vec![s]));
        }
        stages
    }

    /// May the planner be asked again: not done, and turns left?
    fn turns_left(&self, turns: &Turns) -> bool {
        let max = turns.max.unwrap_or(self.catalog.max_turns).max(1) as usize;
        !turns.done && turns.added.len() < max
    }

    /// May a failed step of a saga with `data` be answered by asking the planner
    /// again (`PlannedBuilder::replan_on_failure`, turns left)?
    pub(crate) fn recovers(&self, data: &Value) -> Result<bool> {
        let stored = stored(data)?;
        let turns = Turns::of(data, stored.as_ref());
        let on_failure = turns.on_failure.unwrap_or(self.catalog.replan_on_failure);
        Ok(on_failure && stored.is_some() && self.turns_left(&turns))
    }

    /// Step `step`, of the saga's stage `stage`, failed with `error`, and the planner
    /// will be asked what to do instead: the plan keeps its stages up to that one (the
    /// rest of the turn never ran, and is dropped), and the failure joins `/failed`.
    pub(crate) fn recover(
        &self,
        data: &mut Value,
        stage: usize,
        step: &str,
        error: &str,
    ) -> Result<()> {
        let Some(mut plan) = stored(data)? else {
            return Err(Error::Corrupt("a failure to re-plan without a plan".into()));
        };
        let mut turns = Turns::of(data, Some(&plan));
        // The saga's stages: each turn's planner (if any), then the stages it added.
        let mut at = 0;
        let mut kept = 0;
        'turns: for added in &mut turns.added {
            at += usize::from(self.planner.is_some());
            for k in 0..*added {
                if at == stage {
                    kept += k + 1;
                    *added = k + 1;
                    break 'turns;
                }
                at += 1;
            }
            kept += *added;
        }
        if kept < plan.steps.len() {
            plan.steps.truncate(kept);
            set(data, "plan", serde_json::to_value(&plan)?)?;
            set(data, "turns", serde_json::to_value(&turns.added)?)?;
        }
        let mut failed = match data.get("failed") {
            Some(Value::Array(f)) => f.clone(),
            _ => Vec::new(),
        };
        failed.push(serde_json::json!({ "step": step, "error": error }));
        set(data, "failed", Value::Array(failed))
    }
}

impl Catalog {
    /// The fold of the planner step: its reply (a plan as JSON, or a planner's text
    /// answer) checked and stored at `/plan`.
    pub(crate) fn fold_plan(&self, data: &mut Value, reply: Value) -> Result<()> {
        let first = data.get("turns").is_none() && data.get("plan").is_none_or(Value::is_null);
        if first {
            // The saga keeps the most turns it was started under.
            set(data, "max_turns", Value::from(self.max_turns.max(1)))?;
            set(
                data,
                "replan_on_failure",
                Value::Bool(self.replan_on_failure),
            )?;
        }
        self.fold_turn(data, reply)
    }

    /// The fold of a planner turn after the first (the plan `so_far` is stored): its
    /// reply's stages appended to the plan, checked as a whole ([`Catalog::extend`]),
    /// or `{"done": true}`.
    pub(super) fn fold_turn(&self, data: &mut Value, reply: Value) -> Result<()> {
        // The failures this turn answers are history now.
        if let Some(Value::Array(failed)) = data.as_object_mut().and_then(|o| o.remove("failed")) {
            let mut failures = match data.get("failures") {
                Some(Value::Array(f)) => f.clone(),
                _ => Vec::new(),
            };
            failures.extend(failed);
            set(data, "failures", Value::Array(failures))?;
        }
        let so_far = stored(data)?;
        let mut turns = Turns::of(data, so_far.as_ref()).added;
        if says_done(&reply) {
            turns.push(0);
            set(data, "turns", serde_json::to_value(turns)?)?;
            return set(data, "done", Value::Bool(true));
        }
        // Its last stages and "done" in one answer: `{"steps": […], "done": true}`.
        let mut reply = reply;
        let last = reply
            .as_object_mut()
            .and_then(|o| o.remove("done"))
            .is_some_and(|d| d == Value::Bool(true));
        let more = match reply {
            Value::String(text) => Plan::from_text(&text)?,
            other => Plan::from_json(other)?,
        };
        let (plan, added) = match so_far {
            Some(so_far) => self.extend(so_far, more)?,
            None => {
                let plan = self.accept(more)?;
                let added = plan.steps.len();
                (plan, added)
            }
        };
        turns.push(added);
        set(data, "plan", serde_json::to_value(&plan)?)?;
        set(data, "turns", serde_json::to_value(turns)?)?;
        if last {
            set(data, "done", Value::Bool(true))?;
        }
        Ok(())
    }
}

/// Does a planner's reply say it is done: `{"done": true}`, as JSON or in its text?
pub(super) fn says_done(reply: &Value) -> bool {
    let done = |v: &Value| {
        v.get("done").and_then(Value::as_bool) == Some(true)
            && v.get("steps")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
    };
    match reply {
        Value::String(text) => candidates(text)
            .into_iter()
            .filter_map(|c| serde_json::from_str::<Value>(c).ok())
            .any(|v| done(&v)),
        other => done(other),
    }
}

/// The stored plan in `data`, if it has one.
pub(super) fn stored(data: &Value) -> Result<Option<Plan>> {
    data.get("plan")
        .filter(|p| !p.is_null())
        .map(|p| {
            serde_json::from_value(p.clone())
                .map_err(|e| Error::Corrupt(format!("the stored plan does not decode: {e}")))
        })
        .transpose()
}
