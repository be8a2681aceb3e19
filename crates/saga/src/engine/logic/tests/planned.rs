//! Scenarios of a plan made at run time by a planner step.

use super::*;

/// A planned saga with a planner step: its plan comes back as the planner's text.
fn planned() -> SagaDefinition {
    crate::testing::planned_by_planner("errand")
}

/// The plan the planner answers with, amid prose: search, book (undone from its
/// result), then the pivot.
const PLAN_TEXT: &str = r#"Here you go:
```json
{"steps": [
  {"name": "look", "destination": "search", "command": {"q": {"$from": "/input/topic"}}, "nothing_to_undo": true},
  {"name": "book", "destination": "calendar", "command": {"about": {"$from": "/results/look"}},
   "compensate": {"destination": "calendar", "command": {"cancel": {"$from": "/results/book/event_id"}}}},
  {"name": "send", "destination": "mail", "command": "done", "pivot": true}
]}
```"#;

pub(super) fn planned_sim() -> Sim {
    let mut s = Sim::new(planned());
    s.inst.data = crate::plan::initial_data(json!({ "topic": "sagas" }), None).unwrap();
    let fx = s.start();
    assert_eq!(sent(&fx), ["command#0 -> planner"]);
    assert_eq!(s.command(0).payload, r#"{"topic":"sagas"}"#);
    s
}

/// The planner's plan runs: its steps are dispatched in order with their references
/// resolved; a failure compensates in reverse with the undo built from the result.
pub(super) fn a_plan_made_at_run_time_runs_and_compensates() -> Sim {
    let mut s = planned_sim();
    let fx = s.reply(0, StepOutcome::Ok(json!(PLAN_TEXT)));
    assert_eq!(sent(&fx), ["command#1 -> search"]);
    assert_eq!(s.command(1).payload, r#"{"q":"sagas"}"#);
    assert!(s.inst.data["plan"]["steps"].is_array());
    s.reply(1, StepOutcome::Ok(json!(["a", "b"])));
    assert_eq!(s.command(2).payload, r#"{"about":["a","b"]}"#);
    s.reply(2, StepOutcome::Ok(json!({ "event_id": "ev-9" })));
    assert_eq!(
        s.inst.data["results"]["book"],
        json!({ "event_id": "ev-9" })
    );
    let fx = s.reply(3, fatal("mail server says no"));
    assert_eq!(s.state(), SagaState::Compensating);
    assert_eq!(sent(&fx), ["compensate#2 -> calendar"]);
    assert_eq!(s.compensation(2).payload, r#"{"cancel":"ev-9"}"#);
    s.reply_compensation(2, ok());
    assert_eq!(s.state(), SagaState::Compensated);
    assert!(s.error().contains("mail server says no"), "{}", s.error());
    s
}

/// A planner's answer that is not a valid plan fails the planner step, fatally, with
/// the reason; nothing of it runs.
pub(super) fn an_invalid_plan_fails_the_planner_step() -> Sim {
    let mut s = planned_sim();
    let bad = r#"{"steps": [{"name": "pay", "destination": "payments", "nothing_to_undo": true}]}"#;
    let fx = s.reply(0, StepOutcome::Ok(json!(bad)));
    assert!(
        sent(&fx).iter().all(|m| !m.starts_with("command")),
        "{fx:?}"
    );
    assert_eq!(s.state(), SagaState::Compensated);
    assert!(
        s.error().contains("invalid plan") && s.error().contains("unknown destination `payments`"),
        "{}",
        s.error()
    );
    assert!(s.inst.data.get("plan").is_none());
    s
}
