//! Time in plans: sleep steps (`sleep`, `sleep_until`) and waits that end by time
//! (`or_after`). Durations and times are parsed with `jiff`: durations in its friendly
//! format or ISO 8601, a day as 24 hours (a sleep has no time zone); times in RFC 3339.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::PlanStep;
use super::refs::{reference, resolve};
use crate::Error;
use crate::definition::wake::Wake;

use crate::definition::wake::MAX_SLEEP;

impl PlanStep {
    /// A sleep step: the saga sleeps `duration` (`"3d"`, `"2h 30m"`, `"90s"`,
    /// `"PT5M"`) once it reaches it.
    pub fn sleep(name: impl Into<String>, duration: impl Into<String>) -> Self {
        Self {
            destination: None,
            sleep: Some(duration.into()),
            ..Self::command(name, "", Value::Null)
        }
    }

    /// A sleep step until `until`: an RFC 3339 time, Unix milliseconds, or a
    /// `{"$from": …}` reference to either.
    pub fn sleep_until(name: impl Into<String>, until: Value) -> Self {
        Self {
            destination: None,
            sleep_until: Some(until),
            ..Self::command(name, "", Value::Null)
        }
    }

    /// This wait ends after `after` (the format of [`sleep`](Self::sleep)) without
    /// its signal.
    #[must_use]
    pub fn or_after(mut self, after: impl Into<String>) -> Self {
        self.or_after = Some(after.into());
        self
    }

    /// Whether it is a sleep step (`sleep` or `sleep_until`).
    pub(super) fn is_sleep(&self) -> bool {
        self.sleep.is_some() || self.sleep_until.is_some()
    }
}

/// A duration of a plan (`"3d"`, `"90s"`, `"PT5M"`): positive, at most ten years,
/// in calendar units no longer than a week.
pub(super) fn duration(text: &str) -> std::result::Result<Duration, String> {
    let span: jiff::Span = text
        .parse()
        .map_err(|e| format!("`{text}` is not a duration (\"3d\", \"2h 30m\", \"PT5M\"): {e}"))?;
    let ms = span
        .total((
            jiff::Unit::Millisecond,
            jiff::SpanRelativeTo::days_are_24_hours(),
        ))
        .map_err(|e| format!("`{text}`: {e}"))?;
    if !ms.is_finite() || ms <= 0.0 {
        return Err(format!("`{text}` is not a positive duration"));
    }
    let d = Duration::from_secs_f64(ms / 1000.0);
    if d > MAX_SLEEP {
        return Err(format!("`{text}` is over ten years"));
    }
    Ok(d)
}

/// A time of a plan as Unix milliseconds: an RFC 3339 string or an integer, in the
/// range of times `jiff` knows (years -9999 to 9999).
pub(super) fn time(v: &Value) -> std::result::Result<i64, String> {
    match v {
        Value::String(s) => s
            .parse::<jiff::Timestamp>()
            .map(|t| t.as_millisecond())
            .map_err(|e| format!("`{s}` is not an RFC 3339 time: {e}")),
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| format!("{n} is not a whole number of Unix milliseconds"))
            .and_then(|ms| {
                jiff::Timestamp::from_millisecond(ms)
                    .map(|t| t.as_millisecond())
                    .map_err(|e| format!("{ms} Unix milliseconds is no time: {e}"))
            }),
        other => Err(format!(
            "{other} is neither an RFC 3339 time nor Unix milliseconds"
        )),
    }
}

/// Checks a sleep step's or a wait's time fields (the references in `sleep_until`
/// are checked with the plan's other references).
pub(super) fn check(s: &PlanStep) -> std::result::Result<(), String> {
    if let Some(d) = &s.or_after {
        if s.wait_for.is_none() {
            return Err("`or_after` ends a wait (`wait_for`) by time: only on a wait".into());
        }
        duration(d)?;
    }
    if !s.is_sleep() {
        return Ok(());
    }
    if s.sleep.is_some() && s.sleep_until.is_some() {
        return Err("give either `sleep` or `sleep_until`, not both".into());
    }
    if s.destination.is_some() || s.wait_for.is_some() || s.saga.is_some() {
        return Err(
            "a sleep sends no command and waits for no signal: no `destination`, \
                    `wait_for` or `saga`"
                .into(),
        );
    }
    if !s.command.is_null() || s.compensate.is_some() || s.nothing_to_undo || s.approval {
        return Err(
            "a sleep has no `command`, nothing to undo and no approval: no \
                    `command`, `compensate`, `nothing_to_undo` or `approval`"
                .into(),
        );
    }
    if s.timeout_ms.is_some() || s.max_attempts.is_some() {
        return Err("a sleep has no `timeout_ms` or `max_attempts`".into());
    }
    if let Some(d) = &s.sleep {
        duration(d)?;
    }
    if let Some(until) = &s.sleep_until
        && reference(until).is_none()
    {
        time(until)?;
    }
    Ok(())
}

/// When a checked plan step wakes by time, if it does.
pub(super) fn wake(s: &PlanStep) -> Option<Wake> {
    if let Some(d) = s.sleep.as_deref().or(s.or_after.as_deref()) {
        // Checked with the plan: a duration that parses.
        return duration(d).ok().map(Wake::After);
    }
    let template = s.sleep_until.clone()?;
    let name = s.name.clone();
    Some(Wake::At(Arc::new(move |data: &Value| {
        time(&resolve(&template, data))
            .map_err(|e| Error::InvalidPlan(format!("step `{name}`'s `sleep_until`: {e}")))
    })))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{Error, Plan, PlannedSaga};

    #[test]
    fn durations_and_times_parse_or_say_why() {
        assert_eq!(duration("3d"), Ok(Duration::from_secs(3 * 86_400)));
        assert_eq!(duration("2h 30m"), Ok(Duration::from_secs(9_000)));
        assert_eq!(duration("PT5M"), Ok(Duration::from_secs(300)));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("1w"), Ok(Duration::from_secs(7 * 86_400)));
        for bad in ["", "soon", "-3s", "0s", "1y", "2mo", "11y"] {
            assert!(duration(bad).is_err(), "{bad:?} parsed");
        }
        assert!(duration("3700d").unwrap_err().contains("over ten years"));
        assert_eq!(time(&json!("1970-01-01T00:00:01Z")), Ok(1000));
        assert_eq!(
            time(&json!("2026-11-30T09:00:00+01:00")),
            Ok(1_796_025_600_000)
        );
        assert_eq!(time(&json!(1_796_025_600_000_i64)), Ok(1_796_025_600_000));
        for bad in [
            json!("tomorrow"),
            json!(1.5),
            json!(null),
            json!({"at": 1}),
            json!(i64::MIN),
            json!(i64::MAX),
        ] {
            assert!(time(&bad).is_err(), "{bad} parsed");
        }
    }

    fn saga() -> crate::SagaDefinition {
        PlannedSaga::builder("planned_sleeps", 1)
            .destinations(["mail"])
            .agent_signals(["reply"])
            .build()
            .unwrap()
    }

    fn refused(plan: Plan, why: &str) {
        match saga().check_plan(&plan) {
            Err(Error::InvalidPlan(w)) => assert!(w.contains(why), "{w}"),
            other => panic!("{plan:?} was not refused for {why:?}: {other:?}"),
        }
    }

    // What a plan (an LLM's, say) may say about time, and what it is told when it
    // gets it wrong.
    #[test]
    fn a_plan_sleeps_by_duration_or_until_a_time_and_its_mistakes_are_named() {
        let ok = Plan::new()
            .then(PlanStep::command("send", "mail", json!(1)).nothing_to_undo())
            .then(PlanStep::sleep("wait_a_bit", "3d"))
            .then(PlanStep::sleep_until(
                "until",
                json!({"$from": "/input/at"}),
            ))
            .then(PlanStep::sleep_until(
                "fixed",
                json!("2026-12-01T09:00:00Z"),
            ))
            .then(PlanStep::wait_for("reply", "reply").or_after("2h"))
            .then(PlanStep::command("follow_up", "mail", json!(2)).pivot());
        saga().check_plan(&ok).unwrap();
        let from_json: Plan = serde_json::from_value(json!({"steps": [
            {"name": "nap", "sleep": "90s"},
            {"name": "send", "destination": "mail", "pivot": true}
        ]}))
        .unwrap();
        saga().check_plan(&from_json).unwrap();

        refused(
            Plan::new().then(PlanStep::sleep("s", "soon")),
            "`soon` is not a duration",
        );
        refused(
            Plan::new().then(PlanStep::sleep("s", "-1s")),
            "not a positive duration",
        );
        refused(
            Plan::new().then(PlanStep::sleep_until("s", json!("noon"))),
            "not an RFC 3339 time",
        );
        refused(
            Plan::new().then(PlanStep::sleep_until(
                "s",
                json!({"$from": "/results/nope"}),
            )),
            "nope",
        );
        refused(
            Plan::new().then(PlanStep {
                sleep_until: Some(json!(1)),
                ..PlanStep::sleep("s", "1s")
            }),
            "either `sleep` or `sleep_until`",
        );
        refused(
            Plan::new().then(PlanStep {
                destination: Some("mail".into()),
                ..PlanStep::sleep("s", "1s")
            }),
            "a sleep sends no command",
        );
        refused(
            Plan::new().then(PlanStep::sleep("s", "1s").nothing_to_undo()),
            "a sleep has no `command`",
        );
        refused(
            Plan::new().then(
                PlanStep::command("c", "mail", json!(1))
                    .or_after("1h")
                    .pivot(),
            ),
            "only on a wait",
        );
        refused(
            Plan::new().then(PlanStep::wait_for("w", "reply").or_after("later")),
            "`later` is not a duration",
        );
        // A person's decision does not pass by time: not on a wait agents may not
        // signal, nor on one the plan marks an approval.
        refused(
            Plan::new().then(PlanStep::wait_for("w", "sign_off").or_after("1h")),
            "a person's decision does not pass by time",
        );
        refused(
            Plan::new().then(PlanStep::approval("w", "reply").or_after("1h")),
            "a person's decision does not pass by time",
        );
    }
}
