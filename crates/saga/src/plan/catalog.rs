//! What a planned saga allows (its catalog: destinations, approvals, its planner's
//! name, retries and timeouts), and the check of a plan against it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::RetryPolicy;
use serde_json::Value;

use super::refs::check_refs;
use super::{
    MAX_PLAN_BYTES, MAX_PLAN_NAME_BYTES, MAX_PLAN_STEPS, Plan, PlanStage, PlanStep, invalid, set,
};
use crate::definition::step::StepDef;
use crate::{Error, Result};

/// What a planned saga allows its plans: the destinations they may send to, and the
/// name they may not use (its planner step's).
#[derive(Debug, Clone)]
pub(crate) struct Catalog {
    pub(crate) destinations: BTreeSet<String>,
    /// Signals whose waits are approvals whatever the plan says
    /// (`PlannedBuilder::approvals`).
    pub(crate) approvals: BTreeSet<String>,
    /// Signals an agent may send (`PlannedBuilder::agent_signals`): a wait for any
    /// other is a person's decision.
    pub(crate) agent_signals: BTreeSet<String>,
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
                    && is_turn_name(p, &s.name)
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
        super::time::check(s).map_err(at)?;
        if let (Some(_), Some(signal)) = (&s.or_after, &s.wait_for)
            && (s.approval
                || self.approvals.contains(signal)
                || !self.agent_signals.contains(signal))
        {
            return Err(at(format!(
                "`or_after` on the wait for `{signal}`, a person's decision: a person's \
                 decision does not pass by time (a wait that may end by time waits for a \
                 signal agents may send: PlannedBuilder::agent_signals)"
            )));
        }
        if s.is_sleep() {
            return s
                .sleep_until
                .as_ref()
                .map_or(Ok(()), |until| check_refs(until, earlier, None))
                .map_err(at);
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
                    "it has neither a `destination`, a `wait_for` signal, a `saga` nor a \
                     `sleep`"
                        .into(),
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

/// Is `name` that of a turn of the planner named `planner` (`plan`, `plan_2`, …)?
pub(crate) fn is_turn_name(planner: &str, name: &str) -> bool {
    name == planner
        || name
            .strip_prefix(planner)
            .and_then(|rest| rest.strip_prefix('_'))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The name of the planner's step of turn `turn` (0: the first).
pub(crate) fn turn_name(planner: &str, turn: usize) -> String {
    match turn {
        0 => planner.to_owned(),
        t => format!("{planner}_{}", t + 1),
    }
}
