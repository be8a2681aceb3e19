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

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value, json};

use crate::{Error, Result};

mod catalog;
mod guardrails;
mod refs;
mod stages;
#[cfg(test)]
mod tests;
mod time;
mod turns;

pub(crate) use catalog::{APPROVE_PREFIX, Catalog, Planned, record_result};
pub(crate) use turns::recovering;

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
// A plan holds a few dozen stages at most (`MAX_PLAN_STEPS`), made from JSON: boxing
// its steps would change the public variant for no measurable gain.
#[allow(clippy::large_enum_variant)]
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
    /// The command's payload (with `$from` references); `null` if absent. For a child
    /// saga step, the child's input (also accepted as `input`).
    #[serde(default, skip_serializing_if = "Value::is_null", alias = "input")]
    pub command: Value,
    /// The saga it runs as a child (a child saga step, as
    /// [`Step::saga`](crate::Step::saga)): one the saga allows
    /// ([`PlannedBuilder::child_sagas`](crate::PlannedBuilder::child_sagas)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saga: Option<String>,
    /// The signal it waits for instead of sending a command (a wait step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for: Option<String>,
    /// The wait is a person's decision: its signal is taken only from a person's path,
    /// never from an LLM-facing one (as [`Step::approval`](crate::Step::approval)).
    /// Only on a wait. Every wait of a plan is one already unless the saga lets agents
    /// send its signal (`PlannedBuilder::agent_signals`); `true` keeps it one even then.
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
    /// Set by the engine, never by a plan: on the approval wait it inserts before a
    /// command to a destination that needs a person's approval
    /// ([`PlannedBuilder::approve_before`](crate::PlannedBuilder::approve_before)),
    /// the name of the step whose command the wait approves. A plan that sets it is
    /// refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approves: Option<String>,
    /// A sleep step: how long the saga sleeps once it reaches the step, as a duration
    /// (`"3d"`, `"2h 30m"`, `"90s"`, ISO 8601 `"PT5M"`; a day is 24 hours), as
    /// [`Step::sleep`](crate::Step::sleep). Nothing else but `name` and `pivot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep: Option<String>,
    /// A sleep step until a time: an RFC 3339 time (`"2026-12-01T09:00:00+01:00"`),
    /// Unix milliseconds, or a reference (`{"$from": "/input/remind_at"}`) to either,
    /// resolved when the saga reaches the step; a time past wakes it at once. As
    /// [`Step::sleep_until`](crate::Step::sleep_until).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep_until: Option<Value>,
    /// On a wait whose signal agents may send
    /// ([`PlannedBuilder::agent_signals`](crate::PlannedBuilder::agent_signals): a
    /// person's decision does not pass by time): it ends after this duration (the
    /// format of `sleep`) if its signal has not come, and the saga goes on without it,
    /// as [`Step::or_after`](crate::Step::or_after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub or_after: Option<String>,
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
            saga: None,
            wait_for: None,
            approval: false,
            compensate: None,
            nothing_to_undo: false,
            pivot: false,
            timeout_ms: None,
            max_attempts: None,
            approves: None,
            sleep: None,
            sleep_until: None,
            or_after: None,
        }
    }

    /// A child saga step: the saga `saga` run with `input` (as
    /// [`Step::saga`](crate::Step::saga)); its reply, at `/results/<name>`, is the
    /// child's data once it completed.
    pub fn saga(name: impl Into<String>, saga: impl Into<String>, input: Value) -> Self {
        Self {
            destination: None,
            saga: Some(saga.into()),
            ..Self::command(name, "", input)
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

pub(super) fn invalid(reason: impl Into<String>) -> Error {
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

/// `data[key] = value`, for the data of a planned saga (an object).
pub(super) fn set(data: &mut Value, key: &str, value: Value) -> Result<()> {
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
