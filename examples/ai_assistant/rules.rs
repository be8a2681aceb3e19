//! The rules of the plans: what the planners are told, and what the assistant checks
//! beyond the engine's rules.

use super::*;

/// What the planner is told, after its role ([`llm_stub::PLANNER_ROLE`]): the plan
/// format and the agents it may use. The request says how long to wait for a reply
/// ([`Planning::request`]).
pub(super) const PLANNER_RULES: &str = r#"Answer with the plan that carries out the user's request, as JSON in a ```json fenced block: {"steps": [<stage>, ...]}. Stages run in order; a stage is one step, or {"parallel": [<step>, ...]} for steps that need nothing from each other.
A step is {"name": "<unique snake_case name>", "destination": "<agent>", "command": <JSON>} with how to undo it: "compensate": {"destination": "<agent>", "command": <JSON>}, or "nothing_to_undo": true for a step that changes nothing. The one step that cannot be undone is marked "pivot": true; the steps after it have no undo (they are retried until they succeed). A person's approval is the step {"name": "approval", "wait_for": "approval"}. The company's reply to the email is awaited by the step {"name": "await_reply", "wait_for": "reply", "or_after": "<how long to wait, e.g. \"3d\" or \"2h 30m\">"}: it ends when the reply comes or once that time has passed without one.
In a command, {"$from": "/input/company"} stands for the company of the request, {"$from": "/results/<step>/text"} for what the step <step> of an earlier stage produced, {"$from": "/results/await_reply"} for the reply (null if none came in time), and, in a compensation, {"$from": "/results/<its own step>/id"} for the id of what its step created.
The agents and their commands:
- research: {"op": "do", "company": ...}: notes on the company (its text). Changes nothing.
- calendar: {"op": "do", "company": ...}: reserves a meeting slot (its text: the slot; its id). Undone by {"op": "undo", "id": ...} sent to calendar.
- drafts: {"op": "do", "company": ..., "findings": <the notes>, "slot": <the slot, if one was reserved>, "competitors": [<a competitor's notes>, ...] (if any were researched)}: writes the email (its text: the body; its id). Undone by {"op": "undo", "id": ...} sent to drafts.
- email: {"op": "do", "company": ..., "draft": <the body>}: sends the email. It cannot be unsent: it is the pivot, and the approval comes in a stage before it.
- crm: {"op": "do", "company": ..., "approved_by": {"$from": "/results/approval/by"}}: records the contact, after the email.
- follow_ups: {"op": "do", "company": ..., "reply": {"$from": "/results/await_reply"}}: drafts a follow-up email if no reply came (else notes the reply), in a stage after the wait for the reply, which comes after the email.
To learn about the company's competitors, a plan may delegate, at most three times, each competitor's research to a saga of its own: the step {"name": "<unique name>", "saga": "competitor_research", "input": {"company": "<the competitor's name>"}}, best in a parallel group beside the research. It has no "destination" and no undo to give (it is undone as a whole); the competitor's notes are then {"$from": "/results/<its step>/results/research/text"}.
Use no other agent, no other saga and no other field.
You plan in turns, each answer adding stages after those already planned, which run before you are asked again. In the first turn, plan the research only: the research step (with the competitors' research beside it, and the calendar slot if you want it reserved meanwhile). In a later turn you are told the results so far and the stages planned so far: plan the rest (the calendar slot if you want one and it is not reserved, the draft, which may refer to any earlier step's results, the approval, the email, the CRM record, the wait for the reply, the follow-up), with names no earlier turn used. Once nothing is left to plan, answer {"done": true} in the fenced block instead of a plan. You have at most three turns: the plan must be complete by the last."#;

/// What the planner of a competitor's research is told, after its role
/// ([`llm_stub::RESEARCH_PLANNER_ROLE`]).
pub(super) const RESEARCH_PLANNER_RULES: &str = r#"Answer with the plan that researches the company of the request, as JSON in a ```json fenced block: {"steps": [<stage>, ...]}. Stages run in order; a stage is one step, or {"parallel": [<step>, ...]}.
A step is {"name": "<unique snake_case name>", "destination": "research", "command": {"op": "do", "company": {"$from": "/input/company"}}, "nothing_to_undo": true}: the research agent's notes on the company (its text). It changes nothing.
The notes the request is answered with are the step named "research"'s. Use no other agent, no waits and no other field."#;

/// The assistant's own rules, beyond the engine's: exactly one email, sent by the
/// pivot, in a stage after a wait for a person's approval; a wait for the company's
/// `reply` only in a stage after the email (there is nothing to reply to before), and
/// a follow-up only in a stage after such a wait (it needs to know whether a reply
/// came); at most [`MAX_CHILDREN`] child sagas (each competitor's research costs LLM
/// calls of its own). `plan` is the plan of every turn so far: one that is not
/// `complete` may have no email yet. (A plan need not follow up; the assistant sets
/// how long a wait for `reply` lasts: [`Planner::accept`].)
pub(super) fn house_rules(plan: &Plan, complete: bool) -> Result<(), String> {
    let (mut approved, mut sent, mut awaited) = (false, false, false);
    let mut emails = 0;
    let mut children = 0;
    for stage in &plan.steps {
        for s in stage.members() {
            if s.saga.is_some() {
                children += 1;
                if children > MAX_CHILDREN {
                    return Err(format!(
                        "step `{}` starts more than {MAX_CHILDREN} child sagas",
                        s.name
                    ));
                }
            }
            if s.wait_for.as_deref() == Some(REPLY) && !sent {
                return Err(format!(
                    "step `{}` waits for a `{REPLY}` before the email is sent",
                    s.name
                ));
            }
            if s.destination.as_deref() == Some(FOLLOW_UPS) && !awaited {
                return Err(format!(
                    "step `{}` follows up before a wait for the `{REPLY}`",
                    s.name
                ));
            }
            if s.destination.as_deref() != Some(EMAIL) {
                continue;
            }
            if !s.pivot {
                return Err(format!(
                    "step `{}` sends the email, which cannot be unsent: it must be the pivot",
                    s.name
                ));
            }
            if !approved {
                return Err(format!(
                    "step `{}` sends the email before a wait for `{APPROVAL}`",
                    s.name
                ));
            }
            emails += 1;
        }
        let waits = |signal: &str| {
            stage
                .members()
                .iter()
                .any(|s| s.wait_for.as_deref() == Some(signal))
        };
        approved |= waits(APPROVAL);
        awaited |= waits(REPLY);
        sent |= emails > 0;
    }
    if emails == 0 && complete {
        return Err("the plan sends no email".into());
    }
    Ok(())
}

/// A competitor's research's own rules, beyond the engine's: no wait (no person looks
/// at it), and a step named `research` sent to the research agent (its notes are what
/// the assistant's plan refers to).
pub(super) fn research_rules(plan: &Plan) -> Result<(), String> {
    let steps = || plan.steps.iter().flat_map(PlanStage::members);
    if let Some(s) = steps().find(|s| s.wait_for.is_some()) {
        return Err(format!(
            "step `{}` waits for a signal: a competitor's research waits for no one",
            s.name
        ));
    }
    if !steps().any(|s| s.name == RESEARCH && s.destination.as_deref() == Some(RESEARCH)) {
        return Err(format!(
            "no step `{RESEARCH}` sent to the research agent: the notes would be missing"
        ));
    }
    Ok(())
}

/// Sets the time of each wait for the company's `reply` in `plan` to `after`, the
/// assistant's (`--follow-up-after`), whatever the model wrote.
pub(super) fn set_follow_up_after(plan: &mut Plan, after: &str) {
    for step in steps_mut(plan) {
        if step.wait_for.as_deref() == Some(REPLY) {
            step.or_after = Some(after.to_owned());
        }
    }
}
