//! A planned saga's guardrails (`PlannedBuilder::max_steps`, `approve_before`): a
//! plan checked against them when it is accepted, and rewritten with an approval wait
//! before each command to a destination that needs a person's approval; the wait
//! records the command it approves, and the step sends that record.

use serde_json::Value;

use super::catalog::{APPROVE_PREFIX, Catalog, results_mut};
use super::refs::resolve;
use super::{MAX_PLAN_NAME_BYTES, Plan, PlanStage, PlanStep, invalid, set};
use crate::definition::step::{BuildFn, FoldFn};
use crate::{Error, Result};
use std::sync::Arc;

impl Catalog {
    /// Checks `plan` (given at start, or a planner's reply) against the builder's rules
    /// and this catalog, and returns it as it is stored and run: with an approval wait
    /// before each command to a destination of `approve_before`.
    pub(crate) fn accept(&self, plan: Plan) -> Result<Plan> {
        self.guard(&plan, 0)?;
        self.validate(&plan)?;
        let plan = self.gate(plan)?;
        // The rules again, on the plan as it runs (its size, the pivot's place).
        self.validate(&plan)?;
        Ok(plan)
    }

    /// The stages a planner's later turn (`PlannedBuilder::replan`) adds to the plan
    /// `so_far` (as stored): checked as `accept` checks a plan, the guardrails counting
    /// the steps of every turn, and the rules applied to the whole plan as it will run
    /// (names unique across turns, references to any earlier step, the pivot's place:
    /// after a pivot, nothing undoable). The plan to store, and how many stages the turn
    /// added.
    pub(crate) fn extend(&self, so_far: Plan, more: Plan) -> Result<(Plan, usize)> {
        let written = so_far
            .all_steps()
            .filter(|(_, s)| s.approves.is_none())
            .count();
        self.guard(&more, written)?;
        let more = self.gate(more)?;
        let added = more.steps.len();
        let mut steps = so_far.steps;
        steps.extend(more.steps);
        let plan = Plan { steps };
        self.validate(&plan)?;
        Ok((plan, added))
    }

    /// The guardrails' checks of `plan`, written after `before` steps of earlier turns.
    fn guard(&self, plan: &Plan, before: usize) -> Result<()> {
        let count = before + plan.all_steps().count();
        if let Some(max) = self.max_steps
            && count > max
        {
            return Err(invalid(format!(
                "the plan has {count} steps; this saga allows at most {max} \
                 (PlannedBuilder::max_steps)"
            )));
        }
        for (_, s) in plan.all_steps() {
            if s.approves.is_some() {
                return Err(invalid(format!(
                    "step `{}`: `approves` marks the approval waits the engine inserts \
                     (PlannedBuilder::approve_before); a plan cannot set it",
                    s.name
                )));
            }
            if self.approve_before.is_empty() {
                continue;
            }
            // A compensation is sent without a wait of its own: to a held destination
            // only as the undo of a command the person approved there (it is shown
            // with the command), never as a way around the approval.
            if let Some(c) = &s.compensate
                && self.approve_before.contains(&c.destination)
                && !self.gated(s)
            {
                return Err(invalid(format!(
                    "step `{}`: its compensation goes to `{}`, which needs a person's \
                     approval (PlannedBuilder::approve_before): only a step whose own \
                     command goes there, approved with its undo, may undo there",
                    s.name, c.destination
                )));
            }
            for (what, name) in [("step", Some(&s.name)), ("signal", s.wait_for.as_ref())] {
                if let Some(name) = name
                    && name.starts_with(APPROVE_PREFIX)
                {
                    return Err(invalid(format!(
                        "{what} `{name}`: names starting `{APPROVE_PREFIX}` are the \
                         approval waits this saga inserts before commands to {} \
                         (PlannedBuilder::approve_before); a plan cannot declare one",
                        self.approve_before
                            .iter()
                            .map(String::as_str)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
        }
        Ok(())
    }

    /// Is `s` a command to a destination that needs a person's approval?
    fn gated(&self, s: &PlanStep) -> bool {
        s.saga.is_none()
            && s.wait_for.is_none()
            && s.destination
                .as_ref()
                .is_some_and(|d| self.approve_before.contains(d))
    }

    /// `plan` with an approval wait before each command to a destination of
    /// `approve_before`.
    fn gate(&self, plan: Plan) -> Result<Plan> {
        if self.approve_before.is_empty() {
            return Ok(plan);
        }
        let mut steps = Vec::with_capacity(plan.steps.len());
        for stage in plan.steps {
            let mut waits = Vec::new();
            for s in stage.members().iter().filter(|s| self.gated(s)) {
                let name = format!("{APPROVE_PREFIX}{}", s.name);
                if name.len() > MAX_PLAN_NAME_BYTES {
                    return Err(invalid(format!(
                        "step `{}`: its destination needs a person's approval and its \
                         approval wait `{name}` would be over {MAX_PLAN_NAME_BYTES} bytes: \
                         shorten the step's name",
                        s.name
                    )));
                }
                waits.push(PlanStep {
                    approves: Some(s.name.clone()),
                    ..PlanStep::approval(name.clone(), name)
                });
            }
            match waits.len() {
                0 => {}
                1 => steps.extend(waits.pop().map(PlanStage::Step)),
                _ => steps.push(PlanStage::Parallel { parallel: waits }),
            }
            steps.push(stage);
        }
        Ok(Plan { steps })
    }
}

/// A plan step's part in an approval the engine inserted (`approve_before`).
pub(super) enum Gate {
    /// The approval wait before this step (of the stored plan).
    Wait(Box<PlanStep>),
    /// The step approved by the wait of this name.
    Step(String),
}

/// The command and fold of the approval wait `name` before step `target`: its
/// "command" is what the person approves, the step's command with its references
/// resolved, which the engine records at `/results/<wait>` when it dispatches the wait
/// (and the step then sends); the signal's payload joins it there as `approved`.
pub(super) fn approval_wait(name: &str, target: PlanStep) -> (BuildFn, FoldFn) {
    let record_name = name.to_owned();
    let command: BuildFn = Arc::new(move |data: &Value| {
        let mut record = serde_json::json!({
            "step": target.name,
            "destination": target.destination,
            "command": resolve(&target.command, data),
        });
        // Its undo, approved with it: as the plan wrote it (its references, often to
        // the step's own result, are resolved when it is sent).
        if let Some(undo) = &target.compensate {
            record["compensation"] = serde_json::json!({
                "destination": undo.destination,
                "command": undo.command,
            });
        }
        Ok(record)
    });
    let fold: FoldFn = Arc::new(move |data: &mut Value, reply: Value| {
        let results = results_mut(data)?;
        let mut record = results
            .get(&record_name)
            .cloned()
            .filter(Value::is_object)
            .ok_or_else(|| {
                Error::Corrupt(format!(
                    "the approval wait `{record_name}` has no recorded command"
                ))
            })?;
        set(&mut record, "approved", reply)?;
        set(results, &record_name, record)
    });
    (command, fold)
}

/// The command of a step behind the approval wait `wait`: the command the person
/// approved, as the wait recorded it, not one built again.
pub(super) fn approved_command(wait: String) -> BuildFn {
    Arc::new(move |data: &Value| {
        data.get("results")
            .and_then(|r| r.get(&wait))
            .and_then(|r| r.get("command"))
            .cloned()
            .ok_or_else(|| {
                Error::Corrupt(format!(
                    "the approval wait `{wait}` recorded no command before its step"
                ))
            })
    })
}
