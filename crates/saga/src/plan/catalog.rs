//! What a planned saga allows (its catalog: destinations, approvals, its planner's
//! name, retries and timeouts), the check of a plan against it, and a plan step made
//! into the step the engine runs.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::RetryPolicy;
use serde_json::Value;

use super::guardrails::Gate;
use super::refs::{check_refs, resolve};
use super::{
    MAX_PLAN_BYTES, MAX_PLAN_NAME_BYTES, MAX_PLAN_STEPS, Plan, PlanStage, PlanStep, invalid, set,
};
use crate::definition::step::{StepDef, Undo};
use crate::{Error, Result};

/// What a planned saga allows its plans: the destinations they may send to, and the
/// name they may not use (its planner step's).
#[derive(Debug, Clone)]
pub(crate) struct Catalog {
    pub(crate) destinations: BTreeSet<String>,
    /// Signals whose waits are approvals whatever the plan says
    /// (`PlannedBuilder::approvals`).
    pub(crate) approvals: BTreeSet<String>,
    /// The sagas its plans may run as children, each with whether its definition has a
    /// pivot (`PlannedBuilder::child_sagas`).
    pub(crate) sagas: BTreeMap<String, bool>,
    pub(crate) planner_name: Option<String>,
    /// The retry policy of the plan's steps (a step's `max_attempts` overrides its
    /// attempts).
    pub(crate) retry: RetryPolicy,
    /// The timeout of a plan step that sets none.
    pub(crate) timeout: Option<Duration>,
    /// The most turns of its planner (`PlannedBuilder::replan`; 1: the plan is made
    /// once).
    pub(crate) max_turns: u32,
    /// Is the planner asked again only when a step fails
    /// (`PlannedBuilder::replan_on_failure`)?
    pub(crate) replan_on_failure: bool,
    /// The most steps a plan may have (`PlannedBuilder::max_steps`).
    pub(crate) max_steps: Option<usize>,
    /// Destinations whose commands wait for a person's approval first
    /// (`PlannedBuilder::approve_before`).
    pub(crate) approve_before: BTreeSet<String>,
}

/// The prefix of the approval waits the engine inserts
/// ([`Catalog::approve_before`]): the wait before step `book` is `approve.book`, and
/// waits for the signal of that name.
pub(crate) const APPROVE_PREFIX: &str = "approve.";

/// What makes a saga planned: its catalog and its planner step, if it has one.
#[derive(Debug, Clone)]
pub(crate) struct Planned {
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) planner: Option<StepDef>,
}

impl Planned {
    /// The stages of a saga of this kind whose data is `data`: its planner step (if
    /// any), then the steps of the plan in `data` (once it has one).
    pub(crate) fn stages(&self, data: &Value) -> Result<Vec<Vec<StepDef>>> {
        let mut stages = Vec::new();
        let stored = super::turns::stored(data)?;
        let turns = super::turns::Turns::of(data, stored.as_ref());
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

impl Catalog {
    /// Checks `plan` against the builder's rules and this catalog.
    pub(super) fn validate(&self, plan: &Plan) -> Result<()> {
        let size = serde_json::to_string(plan)?.len();
        if size > MAX_PLAN_BYTES {
            return Err(invalid(format!(
                "the plan is {size} bytes, over the limit of {MAX_PLAN_BYTES}"
            )));
        }
        if plan.steps.is_empty() {
            return Err(invalid("the plan has no steps"));
        }
        let count = plan.all_steps().count();
        if count > MAX_PLAN_STEPS {
            return Err(invalid(format!(
                "the plan has {count} steps, over the limit of {MAX_PLAN_STEPS}"
            )));
        }
        let mut names: HashSet<&str> = HashSet::new();
        if let Some(p) = &self.planner_name {
            names.insert(p.as_str());
        }
        let mut waits: HashSet<&str> = HashSet::new();
        let pivot = plan
            .all_steps()
            .find(|(_, s)| s.pivot)
            .map(|(stage, _)| stage);
        let mut pivots = 0;
        // The names of the steps of earlier stages: what a command may refer to.
        let mut earlier: HashSet<&str> = HashSet::new();
        for (i, stage) in plan.steps.iter().enumerate() {
            let members: &[PlanStep] = match stage {
                PlanStage::Step(s) => std::slice::from_ref(s),
                PlanStage::Parallel { parallel } => {
                    if parallel.is_empty() {
                        return Err(invalid(format!(
                            "stage {} is an empty parallel group",
                            i + 1
                        )));
                    }
                    if let Some(s) = parallel.iter().find(|s| s.pivot) {
                        return Err(invalid(format!(
                            "step `{}`: the pivot cannot be in a parallel group",
                            s.name
                        )));
                    }
                    parallel
                }
            };
            let before_pivot = pivot.is_none_or(|p| i < p);
            for s in members {
                if let Some(p) = &self.planner_name
                    && super::turns::is_turn_name(p, &s.name)
                    && s.name != *p
                {
                    return Err(invalid(format!(
                        "step `{}`: `{p}` and `{p}_<n>` name its planner's turns \
                         (PlannedBuilder::replan)",
                        s.name
                    )));
                }
                self.check_step(s, before_pivot, &earlier)?;
                if !names.insert(&s.name) {
                    return Err(invalid(format!("two steps are named `{}`", s.name)));
                }
                if let Some(w) = &s.wait_for
                    && !waits.insert(w)
                {
                    return Err(invalid(format!("two steps wait for the signal `{w}`")));
                }
                pivots += usize::from(s.pivot);
            }
            earlier.extend(members.iter().map(|s| s.name.as_str()));
        }
        if pivots > 1 {
            return Err(invalid("the plan has more than one pivot"));
        }
        Ok(())
    }

    fn check_step(&self, s: &PlanStep, before_pivot: bool, earlier: &HashSet<&str>) -> Result<()> {
        let name = &s.name;
        let at = |why: String| invalid(format!("step `{name}`: {why}"));
        if name.trim().is_empty() {
            return Err(invalid("a step has an empty name"));
        }
        if name.len() > MAX_PLAN_NAME_BYTES {
            return Err(at(format!("its name is over {MAX_PLAN_NAME_BYTES} bytes")));
        }
        if s.timeout_ms == Some(0) {
            return Err(at("a timeout of 0 ms".into()));
        }
        if s.max_attempts == Some(0) {
            return Err(at("max_attempts of 0".into()));
        }
        if let Some(child) = &s.saga {
            return self
                .check_child(s, child, before_pivot, earlier)
                .map_err(at);
        }
        match (&s.destination, &s.wait_for) {
            (Some(_), Some(_)) => {
                return Err(at(
                    "give either `destination` or `wait_for`, not both".into()
                ));
            }
            (None, None) => {
                return Err(at(
                    "it has neither a `destination`, a `wait_for` signal nor a `saga`".into(),
                ));
            }
            (Some(_), None) if s.approval => {
                return Err(at(
                    "`approval` marks a wait (`wait_for`): a command is no one's decision".into(),
                ));
            }
            (Some(d), None) => self.check_destination(d).map_err(at)?,
            (None, Some(w)) => {
                if w.trim().is_empty() || w.len() > MAX_PLAN_NAME_BYTES {
                    return Err(at(format!(
                        "the signal name must be 1 to {MAX_PLAN_NAME_BYTES} bytes"
                    )));
                }
                if s.compensate.is_some() {
                    return Err(at("a wait has nothing to compensate".into()));
                }
                if !s.command.is_null() {
                    return Err(at("a wait sends no command".into()));
                }
            }
        }
        check_refs(&s.command, earlier, None).map_err(at)?;
        let is_wait = s.wait_for.is_some();
        if before_pivot && !s.pivot {
            if !is_wait {
                match (&s.compensate, s.nothing_to_undo) {
                    (Some(_), true) => {
                        return Err(at(
                            "give either `compensate` or `nothing_to_undo`, not both".into(),
                        ));
                    }
                    (None, false) => {
                        return Err(at("a step before the pivot must say how to undo it: \
                             `compensate` or `nothing_to_undo`"
                            .into()));
                    }
                    _ => {}
                }
            }
        } else if s.compensate.is_some() || s.nothing_to_undo {
            return Err(at(
                "the pivot and the steps after it are never undone: no `compensate` or \
                 `nothing_to_undo`"
                    .into(),
            ));
        }
        if let Some(c) = &s.compensate {
            self.check_destination(&c.destination).map_err(at)?;
            check_refs(&c.command, earlier, Some(name)).map_err(at)?;
        }
        Ok(())
    }

    /// A stage that runs the saga `child` as a child: one the saga allows, undone by
    /// compensating it (so nothing else says how), and, if its definition has a
    /// pivot, the plan's pivot or after it.
    fn check_child(
        &self,
        s: &PlanStep,
        child: &str,
        before_pivot: bool,
        earlier: &HashSet<&str>,
    ) -> std::result::Result<(), String> {
        let Some(&has_pivot) = self.sagas.get(child) else {
            return Err(format!(
                "unknown child saga `{child}` (this saga allows: {})",
                self.sagas
                    .keys()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        if s.destination.is_some() || s.wait_for.is_some() || s.approval {
            return Err("a child saga step has no `destination`, `wait_for` or `approval`".into());
        }
        if s.compensate.is_some() || s.nothing_to_undo {
            return Err(
                "a child saga is undone by compensating it: no `compensate` or `nothing_to_undo`"
                    .into(),
            );
        }
        if has_pivot && before_pivot && !s.pivot {
            return Err(format!(
                "the child saga `{child}` has a pivot and cannot be undone once past it: \
                 it must be the plan's pivot or a step after it"
            ));
        }
        check_refs(&s.command, earlier, None)
    }

    fn check_destination(&self, d: &str) -> std::result::Result<(), String> {
        if self.destinations.contains(d) {
            Ok(())
        } else {
            Err(format!(
                "unknown destination `{d}` (this saga allows: {})",
                self.destinations
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    }

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
}

/// `data["results"]`, an object in a planned saga's data.
pub(super) fn results_mut(data: &mut Value) -> Result<&mut Value> {
    data.get_mut("results")
        .filter(|r| r.is_object())
        .ok_or_else(|| Error::Corrupt("a planned saga's data has no `results`".into()))
}

/// Records `value` as the result `name` in a planned saga's `data`.
pub(crate) fn record_result(data: &mut Value, name: &str, value: Value) -> Result<()> {
    set(results_mut(data)?, name, value)
}

pub(super) fn step_def(
    s: PlanStep,
    catalog: &Catalog,
    before_pivot: bool,
    gate: Option<Gate>,
) -> StepDef {
    let name = s.name.clone();
    let fold_name = name.clone();
    let fold: crate::definition::step::FoldFn =
        Arc::new(move |data: &mut Value, reply: Value| record_result(data, &fold_name, reply));
    let retry = RetryPolicy {
        max_attempts: s.max_attempts.unwrap_or(catalog.retry.max_attempts),
        ..catalog.retry
    };
    let timeout = s.timeout_ms.map(Duration::from_millis).or(catalog.timeout);
    if let Some(signal) = s.wait_for {
        let (command, fold, approves): (crate::definition::step::BuildFn, _, _) = match gate {
            Some(Gate::Wait(target)) => {
                let (command, fold) = super::guardrails::approval_wait(&name, *target);
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
            approval: s.approval || approves.is_some() || catalog.approvals.contains(&signal),
            wait: Some(signal),
            child: None,
            approves,
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
            Some(Gate::Step(wait)) => super::guardrails::approved_command(wait),
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
    }
}
