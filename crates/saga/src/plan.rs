//! Plans made at run time: sagas whose steps are data.
//!
//! An LLM planner (or any code) produces a [`Plan`]: stages of steps, each a command
//! to a destination with a JSON payload and how to undo it, or a wait for a signal;
//! an optional pivot; parallel groups. A saga registered with
//! [`PlannedSaga`](crate::PlannedSaga) runs it. The plan is checked against the
//! same rules the typed builder enforces at compile time, plus the destinations the
//! saga allows, when the saga starts (or, for a saga with a planner step, when the
//! planner replies): a plan that breaks one is a typed error, and nothing of it is
//! written or run.
//!
//! The plan is stored in the saga's data, beside the caller's input and the steps'
//! results (`{"input": …, "plan": …, "results": {"<step>": <reply>, …}}`), so a
//! process that restarts resumes it without the code that made it.
//!
//! A plan is data, never code. Its commands are JSON sent as they are, except that an
//! object `{"$from": "<JSON pointer>"}` anywhere in a command is replaced, when the
//! command is built, by the value at that pointer in the saga data: `/input/...`, or
//! `/results/<step>/...` of a step of an earlier stage (a compensation may also name
//! its own step's result, which is `null` when the step's outcome is unknown). A
//! pointer to nothing gives `null`.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::RetryPolicy;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value, json};

use crate::definition::step::{StepDef, Undo};
use crate::{Error, Result};

/// The most steps a plan may have, waits and parallel members included.
pub const MAX_PLAN_STEPS: usize = 64;
/// The largest plan, as JSON text, in bytes.
pub const MAX_PLAN_BYTES: usize = 64 * 1024;
/// The longest step or wait name, in bytes.
pub const MAX_PLAN_NAME_BYTES: usize = 100;

/// A saga's steps as data: stages run in order; a stage is one step or a parallel
/// group. JSON: `{"steps": [<step>, {"parallel": [<step>, …]}, …]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// The stages, in order.
    pub steps: Vec<PlanStage>,
}

/// One stage of a [`Plan`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PlanStage {
    /// A step on its own.
    Step(PlanStep),
    /// Steps dispatched together and joined when all have replied (compensated
    /// together too).
    Parallel {
        /// The group's steps.
        parallel: Vec<PlanStep>,
    },
}

impl<'de> Deserialize<'de> for PlanStage {
    // By hand: an untagged enum's error ("did not match any variant") would hide
    // which field of which step is wrong.
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Group {
            parallel: Vec<PlanStep>,
        }
        let v = Value::deserialize(d)?;
        if v.get("parallel").is_some() {
            let g: Group = serde_json::from_value(v).map_err(serde::de::Error::custom)?;
            Ok(PlanStage::Parallel {
                parallel: g.parallel,
            })
        } else {
            let s: PlanStep = serde_json::from_value(v).map_err(serde::de::Error::custom)?;
            Ok(PlanStage::Step(s))
        }
    }
}

/// One step of a [`Plan`]: a command to `destination` (with `command`), or a wait
/// for the signal `wait_for`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanStep {
    /// Unique in the plan; its reply is stored at `/results/<name>`.
    pub name: String,
    /// The agent destination its command goes to (a command step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// The command's payload (with `$from` references); `null` if absent.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub command: Value,
    /// The signal it waits for instead of sending a command (a wait step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for: Option<String>,
    /// The wait is a person's decision: its signal is taken only from a person's path,
    /// never from an LLM-facing one (as [`Step::approval`](crate::Step::approval)).
    /// Only on a wait.
    #[serde(default, skip_serializing_if = "is_false")]
    pub approval: bool,
    /// How to undo it: a command to a destination, built when the compensation is
    /// dispatched (so it may name the step's own result).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensate: Option<PlanCommand>,
    /// Declares that the step changes nothing that needs undoing.
    #[serde(default, skip_serializing_if = "is_false")]
    pub nothing_to_undo: bool,
    /// The point of no return (at most one, not in a parallel group).
    #[serde(default, skip_serializing_if = "is_false")]
    pub pivot: bool,
    /// How long an attempt may take once an agent starts it (or how long a wait
    /// waits), in milliseconds (default: the saga's,
    /// [`PlannedBuilder::step_timeout`](crate::PlannedBuilder::step_timeout)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Attempts in all for retryable failures before the step fails (default: the
    /// saga's, [`PlannedBuilder::retry`](crate::PlannedBuilder::retry)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
}

/// A compensation in a [`Plan`]: where it goes and its payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanCommand {
    /// The agent destination.
    pub destination: String,
    /// The payload (with `$from` references); `null` if absent.
    #[serde(default)]
    pub command: Value,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if signature
fn is_false(b: &bool) -> bool {
    !*b
}

impl PlanStep {
    /// A command step: `command` sent to `destination`.
    pub fn command(
        name: impl Into<String>,
        destination: impl Into<String>,
        command: Value,
    ) -> Self {
        Self {
            name: name.into(),
            destination: Some(destination.into()),
            command,
            wait_for: None,
            approval: false,
            compensate: None,
            nothing_to_undo: false,
            pivot: false,
            timeout_ms: None,
            max_attempts: None,
        }
    }

    /// A wait step: the saga parks until signal `signal` arrives.
    pub fn wait_for(name: impl Into<String>, signal: impl Into<String>) -> Self {
        Self {
            destination: None,
            command: Value::Null,
            wait_for: Some(signal.into()),
            ..Self::command(name, "", Value::Null)
        }
    }

    /// A wait step for a person's decision: as [`wait_for`](Self::wait_for), marked
    /// [`approval`](Self::approval).
    pub fn approval(name: impl Into<String>, signal: impl Into<String>) -> Self {
        Self {
            approval: true,
            ..Self::wait_for(name, signal)
        }
    }

    /// Undone by `command` sent to `destination`.
    #[must_use]
    pub fn compensate(mut self, destination: impl Into<String>, command: Value) -> Self {
        self.compensate = Some(PlanCommand {
            destination: destination.into(),
            command,
        });
        self
    }

    /// Nothing to undo.
    #[must_use]
    pub fn nothing_to_undo(mut self) -> Self {
        self.nothing_to_undo = true;
        self
    }

    /// The pivot.
    #[must_use]
    pub fn pivot(mut self) -> Self {
        self.pivot = true;
        self
    }

    /// Its timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }
}

impl Plan {
    /// An empty plan (add stages with [`then`](Self::then) and
    /// [`parallel`](Self::parallel)).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a stage of one step.
    #[must_use]
    pub fn then(mut self, step: PlanStep) -> Self {
        self.steps.push(PlanStage::Step(step));
        self
    }

    /// Adds a parallel group.
    #[must_use]
    pub fn parallel(mut self, steps: impl IntoIterator<Item = PlanStep>) -> Self {
        self.steps.push(PlanStage::Parallel {
            parallel: steps.into_iter().collect(),
        });
        self
    }

    /// A plan from JSON: `{"steps": [...]}`, or the bare array of stages. Only its
    /// shape is checked here; [`PlannedSaga`](crate::PlannedSaga) sagas check the
    /// rest when they start.
    ///
    /// # Errors
    /// [`Error::InvalidPlan`] saying what does not fit.
    pub fn from_json(value: Value) -> Result<Self> {
        let size = value.to_string().len();
        if size > MAX_PLAN_BYTES {
            return Err(invalid(format!(
                "the plan is {size} bytes, over the limit of {MAX_PLAN_BYTES}"
            )));
        }
        let value = match value {
            Value::Array(stages) => json!({ "steps": stages }),
            other => other,
        };
        serde_json::from_value(value).map_err(|e| invalid(e.to_string()))
    }

    /// A plan from a planner's text answer, which may be bare JSON, JSON in a fenced
    /// code block (```` ```json ````), or JSON amid prose (the outermost `{…}` or
    /// `[…]`). It is parsed as data, never run.
    ///
    /// # Errors
    /// [`Error::InvalidPlan`]: no JSON in the text, or JSON that is not a plan.
    pub fn from_text(text: &str) -> Result<Self> {
        if text.len() > MAX_PLAN_BYTES {
            return Err(invalid(format!(
                "the planner's answer is {} bytes, over the limit of {MAX_PLAN_BYTES}",
                text.len()
            )));
        }
        let value = candidates(text)
            .into_iter()
            .find_map(|c| serde_json::from_str::<Value>(c.trim()).ok())
            .ok_or_else(|| {
                let head: String = text.trim().chars().take(80).collect();
                invalid(format!("no JSON plan in the planner's answer: {head:?}"))
            })?;
        Self::from_json(value)
    }

    fn all_steps(&self) -> impl Iterator<Item = (usize, &PlanStep)> {
        self.steps
            .iter()
            .enumerate()
            .flat_map(|(i, stage)| stage.members().iter().map(move |s| (i, s)))
    }
}

impl PlanStage {
    /// Its steps: one, or the group's.
    pub fn members(&self) -> &[PlanStep] {
        match self {
            PlanStage::Step(s) => std::slice::from_ref(s),
            PlanStage::Parallel { parallel } => parallel,
        }
    }
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidPlan(reason.into())
}

/// Where a JSON plan may be in a planner's text, most likely first.
fn candidates(text: &str) -> Vec<&str> {
    let mut out = vec![text];
    // A fenced block: ``` or ```json, up to the next fence.
    if let Some(open) = text.find("```") {
        let rest = &text[open + 3..];
        let body = rest.find('\n').map_or(rest, |nl| &rest[nl + 1..]);
        if let Some(close) = body.find("```") {
            out.push(&body[..close]);
        }
    }
    for (a, b) in [('{', '}'), ('[', ']')] {
        if let (Some(s), Some(e)) = (text.find(a), text.rfind(b))
            && s < e
        {
            out.push(&text[s..=e]);
        }
    }
    out
}

/// What a planned saga allows its plans: the destinations they may send to, and the
/// name they may not use (its planner step's).
#[derive(Debug, Clone)]
pub(crate) struct Catalog {
    pub(crate) destinations: BTreeSet<String>,
    /// Signals whose waits are approvals whatever the plan says
    /// (`PlannedBuilder::approvals`).
    pub(crate) approvals: BTreeSet<String>,
    pub(crate) planner_name: Option<String>,
    /// The retry policy of the plan's steps (a step's `max_attempts` overrides its
    /// attempts).
    pub(crate) retry: RetryPolicy,
    /// The timeout of a plan step that sets none.
    pub(crate) timeout: Option<Duration>,
}

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
        if let Some(p) = &self.planner {
            stages.push(vec![p.clone()]);
        }
        if let Some(plan) = data.get("plan").filter(|p| !p.is_null()) {
            let plan: Plan = serde_json::from_value(plan.clone())
                .map_err(|e| Error::Corrupt(format!("the stored plan does not decode: {e}")))?;
            for stage in plan.steps {
                let def = |s| step_def(s, &self.catalog);
                stages.push(match stage {
                    PlanStage::Step(s) => vec![def(s)],
                    PlanStage::Parallel { parallel } => parallel.into_iter().map(def).collect(),
                });
            }
        }
        Ok(stages)
    }
}

impl Catalog {
    /// Checks `plan` against the builder's rules and this catalog.
    pub(crate) fn validate(&self, plan: &Plan) -> Result<()> {
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
        match (&s.destination, &s.wait_for) {
            (Some(_), Some(_)) => {
                return Err(at(
                    "give either `destination` or `wait_for`, not both".into()
                ));
            }
            (None, None) => {
                return Err(at(
                    "it has neither a `destination` nor a `wait_for` signal".into()
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
        let plan = match reply {
            Value::String(text) => Plan::from_text(&text)?,
            other => Plan::from_json(other)?,
        };
        self.validate(&plan)?;
        set(data, "plan", serde_json::to_value(&plan)?)?;
        Ok(())
    }
}

/// `data[key] = value`, for the data of a planned saga (an object).
fn set(data: &mut Value, key: &str, value: Value) -> Result<()> {
    match data {
        Value::Object(m) => {
            m.insert(key.to_owned(), value);
            Ok(())
        }
        _ => Err(Error::Corrupt(
            "a planned saga's data is not an object".into(),
        )),
    }
}

/// The data a planned saga starts with.
pub(crate) fn initial_data(input: Value, plan: Option<&Plan>) -> Result<Value> {
    let mut m = Map::new();
    m.insert("input".into(), input);
    if let Some(plan) = plan {
        m.insert("plan".into(), serde_json::to_value(plan)?);
    }
    m.insert("results".into(), Value::Object(Map::new()));
    Ok(Value::Object(m))
}

/// What a caller passes to start a planned saga that has no planner step: the plan
/// and the input. `start_saga(name, &PlanStart::new(plan, input))`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanStart {
    /// The steps to run.
    pub plan: Plan,
    /// The caller's input, at `/input` in the saga data.
    #[serde(default)]
    pub input: Value,
}

impl PlanStart {
    /// `plan` with `input` (any serializable value; `Value::Null` for none).
    pub fn new(plan: Plan, input: impl Serialize) -> Result<Self> {
        Ok(Self {
            plan,
            input: serde_json::to_value(input)?,
        })
    }
}

fn step_def(s: PlanStep, catalog: &Catalog) -> StepDef {
    let name = s.name.clone();
    let fold_name = name.clone();
    let fold: crate::definition::step::FoldFn = Arc::new(move |data: &mut Value, reply: Value| {
        let results = data
            .get_mut("results")
            .filter(|r| r.is_object())
            .ok_or_else(|| Error::Corrupt("a planned saga's data has no `results`".into()))?;
        set(results, &fold_name, reply)
    });
    let retry = RetryPolicy {
        max_attempts: s.max_attempts.unwrap_or(catalog.retry.max_attempts),
        ..catalog.retry
    };
    let timeout = s.timeout_ms.map(Duration::from_millis).or(catalog.timeout);
    if let Some(signal) = s.wait_for {
        return StepDef {
            destination: format!("signal:{signal}"),
            name,
            command: Arc::new(|_: &Value| Ok(Value::Null)),
            fold: Some(fold),
            undo: Undo::Nothing,
            retry,
            timeout,
            start_timeout: None,
            pivot: s.pivot,
            approval: s.approval || catalog.approvals.contains(&signal),
            wait: Some(signal),
        };
    }
    let template = s.command;
    let undo = match (s.compensate, s.nothing_to_undo) {
        _ if s.pivot => Undo::Never,
        (Some(c), _) => {
            let template = c.command;
            Undo::FromReply {
                destination: c.destination,
                build: Arc::new(move |data: &Value, _reply: Option<&Value>| {
                    Ok(resolve(&template, data))
                }),
            }
        }
        (None, true) => Undo::Nothing,
        (None, false) => Undo::Never,
    };
    StepDef {
        name,
        destination: s.destination.unwrap_or_default(),
        command: Arc::new(move |data: &Value| Ok(resolve(&template, data))),
        fold: Some(fold),
        undo,
        retry,
        timeout,
        start_timeout: None,
        pivot: s.pivot,
        wait: None,
        approval: false,
    }
}

/// The pointer of `v` if it is a reference, `{"$from": "<pointer>"}`.
fn reference(v: &Value) -> Option<&Value> {
    match v {
        Value::Object(m) if m.contains_key("$from") => m.get("$from"),
        _ => None,
    }
}

/// `template` with each reference replaced by what it points to in `data` (`null`
/// for nothing).
fn resolve(template: &Value, data: &Value) -> Value {
    if let Some(Value::String(p)) = reference(template) {
        return data.pointer(p).cloned().unwrap_or(Value::Null);
    }
    match template {
        Value::Array(a) => Value::Array(a.iter().map(|v| resolve(v, data)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), resolve(v, data)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Checks every reference in `v`: a string pointer into `/input`, or into the
/// results of an `earlier` step (or of step `own`, for a compensation).
fn check_refs(
    v: &Value,
    earlier: &HashSet<&str>,
    own: Option<&str>,
) -> std::result::Result<(), String> {
    if let Value::Object(m) = v
        && let Some(p) = m.get("$from")
    {
        if m.len() != 1 {
            return Err("a reference is an object with `$from` alone".into());
        }
        let Value::String(p) = p else {
            return Err("`$from` must be a JSON pointer string".into());
        };
        let mut parts = p.split('/');
        let ok = parts.next() == Some("")
            && match parts.next() {
                Some("input") => true,
                Some("results") => parts.next().is_some_and(|step| {
                    let step = step.replace("~1", "/").replace("~0", "~");
                    earlier.contains(step.as_str()) || own == Some(step.as_str())
                }),
                _ => false,
            };
        if !ok {
            return Err(format!(
                "`$from: {p}` must point into /input or into /results/<step> of a step \
                 of an earlier stage{}",
                if own.is_some() {
                    " (or of this step)"
                } else {
                    ""
                }
            ));
        }
        return Ok(());
    }
    match v {
        Value::Array(a) => a.iter().try_for_each(|v| check_refs(v, earlier, own)),
        Value::Object(m) => m.values().try_for_each(|v| check_refs(v, earlier, own)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        Catalog {
            destinations: ["search", "calendar", "mail"]
                .into_iter()
                .map(String::from)
                .collect(),
            approvals: ["sign_off".to_owned()].into_iter().collect(),
            planner_name: None,
            retry: RetryPolicy::default(),
            timeout: None,
        }
    }

    fn good() -> Plan {
        Plan::new()
            .then(
                PlanStep::command(
                    "look",
                    "search",
                    json!({ "q": { "$from": "/input/topic" } }),
                )
                .nothing_to_undo(),
            )
            .parallel([
                PlanStep::command(
                    "book",
                    "calendar",
                    json!({ "notes": { "$from": "/results/look" } }),
                )
                .compensate(
                    "calendar",
                    json!({ "cancel": { "$from": "/results/book/id" } }),
                ),
                PlanStep::wait_for("ok", "approval"),
            ])
            .then(PlanStep::command("send", "mail", json!("hi")).pivot())
            .then(PlanStep::command("log", "mail", Value::Null))
    }

    fn refused(plan: &Plan, needle: &str) {
        match catalog().validate(plan) {
            Err(Error::InvalidPlan(why)) => assert!(why.contains(needle), "{why}"),
            other => panic!("expected InvalidPlan containing {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn a_good_plan_passes_and_round_trips() {
        let plan = good();
        catalog().validate(&plan).unwrap();
        let text = serde_json::to_string(&plan).unwrap();
        assert_eq!(Plan::from_text(&text).unwrap(), plan);
        let planned = Planned {
            catalog: Arc::new(catalog()),
            planner: None,
        };
        let stages = planned
            .stages(&initial_data(json!({ "topic": "rust" }), Some(&plan)).unwrap())
            .unwrap();
        assert_eq!(
            stages.iter().map(Vec::len).collect::<Vec<_>>(),
            [1, 2, 1, 1]
        );
        assert!(matches!(stages[0][0].undo, Undo::Nothing));
        assert!(matches!(stages[1][0].undo, Undo::FromReply { .. }));
        assert_eq!(stages[1][1].wait.as_deref(), Some("approval"));
        assert!(stages[2][0].pivot && matches!(stages[2][0].undo, Undo::Never));
    }

    // A wait is a person's decision when the plan marks it, or when the saga names its
    // signal among its approvals whatever the plan says; a plain wait is not.
    #[test]
    fn approvals_are_marked_by_the_plan_or_the_saga() {
        let plan = Plan::new()
            .then(PlanStep::command("find", "search", Value::Null).nothing_to_undo())
            .then(PlanStep::approval("ok", "approval"))
            .then(PlanStep::wait_for("boss", "sign_off"))
            .then(PlanStep::wait_for("event", "webhook"))
            .then(PlanStep::command("send", "mail", json!("hi")).pivot());
        catalog().validate(&plan).unwrap();
        let text = serde_json::to_string(&plan).unwrap();
        assert!(text.contains(r#""approval":true"#), "{text}");
        assert_eq!(Plan::from_text(&text).unwrap(), plan);
        let planned = Planned {
            catalog: Arc::new(catalog()),
            planner: None,
        };
        let stages = planned
            .stages(&initial_data(Value::Null, Some(&plan)).unwrap())
            .unwrap();
        let approvals: Vec<(Option<&str>, bool)> = stages
            .iter()
            .flatten()
            .map(|s| (s.wait.as_deref(), s.approval))
            .collect();
        assert_eq!(
            approvals,
            [
                (None, false),
                (Some("approval"), true),
                (Some("sign_off"), true),
                (Some("webhook"), false),
                (None, false),
            ]
        );
        let mut marked = PlanStep::command("send", "mail", Value::Null).pivot();
        marked.approval = true;
        refused(&Plan::new().then(marked), "`approval` marks a wait");
    }

    #[test]
    fn the_builders_rules_are_enforced() {
        let undone = |p: PlanStep| p.nothing_to_undo();
        refused(&Plan::new(), "no steps");
        refused(
            &Plan::new().then(PlanStep::command("a", "search", Value::Null)),
            "must say how to undo",
        );
        refused(
            &Plan::new()
                .then(undone(PlanStep::command("a", "search", Value::Null)))
                .then(undone(PlanStep::command("a", "mail", Value::Null))),
            "two steps are named `a`",
        );
        refused(
            &Plan::new().then(undone(PlanStep::command("a", "payments", Value::Null))),
            "unknown destination `payments`",
        );
        refused(
            &Plan::new().then(
                PlanStep::command("a", "search", Value::Null).compensate("refunds", Value::Null),
            ),
            "unknown destination `refunds`",
        );
        refused(
            &Plan::new()
                .then(PlanStep::command("p", "mail", Value::Null).pivot())
                .then(PlanStep::command("b", "mail", Value::Null).compensate("mail", json!(1))),
            "never undone",
        );
        refused(
            &Plan::new()
                .then(PlanStep::command("p", "mail", Value::Null).pivot())
                .then(PlanStep::command("q", "mail", Value::Null).pivot()),
            "more than one pivot",
        );
        refused(
            &Plan::new().parallel([PlanStep::command("p", "mail", Value::Null).pivot()]),
            "parallel group",
        );
        refused(&Plan::new().parallel([]), "empty parallel group");
        refused(
            &Plan::new()
                .then(PlanStep::wait_for("w1", "go"))
                .then(PlanStep::wait_for("w2", "go")),
            "two steps wait for the signal `go`",
        );
        refused(
            &Plan::new().then(undone(PlanStep::command(
                "a",
                "search",
                json!({ "$from": "/results/a" }),
            ))),
            "earlier stage",
        );
        refused(
            &Plan::new().then(undone(PlanStep::command(
                "a",
                "search",
                json!({ "$from": "/etc/passwd" }),
            ))),
            "/etc/passwd",
        );
        let mut both = PlanStep::command("a", "search", Value::Null).nothing_to_undo();
        both.wait_for = Some("x".into());
        refused(&Plan::new().then(both), "not both");
    }

    #[test]
    fn a_planners_text_is_read_as_data() {
        let plan = good();
        let json = serde_json::to_string_pretty(&plan).unwrap();
        let fenced = format!("Here is the plan:\n```json\n{json}\n```\nGood luck!");
        assert_eq!(Plan::from_text(&fenced).unwrap(), plan);
        let prose = format!("Sure. {json} That's it.");
        assert_eq!(Plan::from_text(&prose).unwrap(), plan);
        let bare = serde_json::to_string(&plan.steps).unwrap();
        assert_eq!(Plan::from_text(&bare).unwrap(), plan);
        for nonsense in [
            "I cannot help with that.",
            "{ not json",
            "{\"steps\": 3}",
            "rm -rf / ; {\"steps\": [{\"name\": \"a\", \"exec\": \"sh\"}]}",
        ] {
            assert!(
                matches!(Plan::from_text(nonsense), Err(Error::InvalidPlan(_))),
                "{nonsense}"
            );
        }
        let huge = "x".repeat(MAX_PLAN_BYTES + 1);
        assert!(
            matches!(Plan::from_text(&huge), Err(Error::InvalidPlan(why)) if why.contains("limit"))
        );
    }

    #[test]
    fn references_resolve_against_the_data() {
        let data = json!({ "input": { "topic": "rust" }, "results": { "look": { "n": 3 } } });
        let t = json!({ "q": { "$from": "/input/topic" }, "all": [{ "$from": "/results/look/n" }, { "$from": "/results/none" }] });
        assert_eq!(resolve(&t, &data), json!({ "q": "rust", "all": [3, null] }));
    }
}
