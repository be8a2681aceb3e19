//! A planned saga's stages, made from its data: the planner's turns and the steps of
//! the plan so far, each plan step made into the step the engine runs (with the
//! approval gates the engine inserted).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::RetryPolicy;
use serde_json::Value;

use super::catalog::{Catalog, Planned, record_result};
use super::guardrails::{Gate, approval_wait, approved_command};
use super::refs::resolve;
use super::turns::{Turns, stored};
use super::{PlanStage, PlanStep};
use crate::Result;
use crate::definition::step::{StepDef, Undo};

impl Planned {
    /// The stages of a saga of this kind whose data is `data`: its planner step (if
    /// any), then the steps of the plan in `data` (once it has one).
    pub(crate) fn stages(&self, data: &Value) -> Result<Vec<Vec<StepDef>>> {
        let mut stages = Vec::new();
        let stored = stored(data)?;
        let turns = Turns::of(data, stored.as_ref());
        if let Some(plan) = stored {
            let pivot = plan
                .all_steps()
                .find(|(_, s)| s.pivot)
                .map(|(stage, _)| stage);
            // The approval waits the engine inserted (marked in the stored plan, so a
            // saga resumes as it was accepted whatever the builder says now), by the
            // step each approves.
            let gates: BTreeMap<String, (String, PlanStep)> = plan
                .all_steps()
                .filter_map(|(_, w)| {
                    let target = w.approves.as_ref()?;
                    let step = plan
                        .all_steps()
                        .map(|(_, s)| s)
                        .find(|s| &s.name == target)?;
                    Some((target.clone(), (w.name.clone(), step.clone())))
                })
                .collect();
            for (i, stage) in plan.steps.into_iter().enumerate() {
                let before_pivot = pivot.is_none_or(|p| i < p);
                let def = |s: PlanStep| {
                    let gate = s
                        .approves
                        .as_ref()
                        .and_then(|t| gates.get(t))
                        .map(|(_, target)| Gate::Wait(Box::new(target.clone())))
                        .or_else(|| gates.get(&s.name).map(|(w, _)| Gate::Step(w.clone())));
                    step_def(s, &self.catalog, before_pivot, gate)
                };
                stages.push(match stage {
                    PlanStage::Step(s) => vec![def(s)],
                    PlanStage::Parallel { parallel } => parallel.into_iter().map(def).collect(),
                });
            }
        }
        Ok(self.by_turn(&turns, stages))
    }
}

fn step_def(s: PlanStep, catalog: &Catalog, before_pivot: bool, gate: Option<Gate>) -> StepDef {
    let name = s.name.clone();
    let fold_name = name.clone();
    let fold: crate::definition::step::FoldFn =
        Arc::new(move |data: &mut Value, reply: Value| record_result(data, &fold_name, reply));
    let retry = RetryPolicy {
        max_attempts: s.max_attempts.unwrap_or(catalog.retry.max_attempts),
        ..catalog.retry
    };
    let timeout = s.timeout_ms.map(Duration::from_millis).or(catalog.timeout);
    let wake = super::time::wake(&s);
    // A checked plan's sleep always has its wake-up.
    if let Some(w) = wake.clone().filter(|_| s.is_sleep()) {
        return StepDef {
            retry,
            pivot: s.pivot,
            ..StepDef::sleep(name, w)
        };
    }
    if let Some(signal) = s.wait_for {
        let (command, fold, approves): (crate::definition::step::BuildFn, _, _) = match gate {
            Some(Gate::Wait(target)) => {
                let (command, fold) = approval_wait(&name, *target);
                (command, fold, Some(name.clone()))
            }
            _ => (Arc::new(|_: &Value| Ok(Value::Null)), fold, None),
        };
        return StepDef {
            destination: format!("signal:{signal}"),
            name,
            command,
            fold: Some(fold),
            undo: Undo::Nothing,
            retry,
            timeout,
            start_timeout: None,
            pivot: s.pivot,
            // A person's decision unless the saga (not the plan) lets agents send it.
            approval: s.approval
                || approves.is_some()
                || catalog.approvals.contains(&signal)
                || !catalog.agent_signals.contains(&signal),
            wait: Some(signal),
            child: None,
            approves,
            wake,
        };
    }
    let template = s.command;
    // A child saga is undone by compensating it, before the pivot (the check allows
    // only a child without a pivot there).
    let undo = match (&s.saga, s.compensate, s.nothing_to_undo) {
        (Some(child), ..) if before_pivot && !s.pivot => Undo::child(child),
        (Some(_), ..) => Undo::Never,
        _ if s.pivot => Undo::Never,
        (None, Some(c), _) => {
            let template = c.command;
            Undo::FromReply {
                destination: c.destination,
                build: Arc::new(move |data: &Value, _reply: Option<&Value>| {
                    Ok(resolve(&template, data))
                }),
            }
        }
        (None, None, true) => Undo::Nothing,
        (None, None, false) => Undo::Never,
    };
    let destination = match &s.saga {
        Some(child) => crate::child_destination(child),
        None => s.destination.unwrap_or_default(),
    };
    StepDef {
        name,
        destination,
        command: match gate {
            Some(Gate::Step(wait)) => approved_command(wait),
            _ => Arc::new(move |data: &Value| Ok(resolve(&template, data))),
        },
        fold: Some(fold),
        undo,
        retry,
        timeout,
        start_timeout: None,
        pivot: s.pivot,
        wait: None,
        approval: false,
        child: s.saga,
        approves: None,
        wake: None,
    }
}
