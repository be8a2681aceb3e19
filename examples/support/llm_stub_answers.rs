//! What the LLM stub answers: a plain text, or the planner's plan (a fenced JSON block
//! amid prose), deterministic per seed and key.

use super::*;

/// The stub's "answer": plain, deterministic, and honest about where it comes from.
pub(super) fn compose(seed: u64, key: &str, prompt: &str) -> String {
    const OPENINGS: [&str; 4] = [
        "Here is what I found.",
        "In short:",
        "A brief answer follows.",
        "Certainly.",
    ];
    let pick = (unit(seed, key, 0, "text") * OPENINGS.len() as f64) as usize;
    let asked: String = prompt.chars().take(160).collect();
    format!(
        "{} (A local stub answered this; the request read: \"{asked}\")",
        OPENINGS[pick.min(OPENINGS.len() - 1)]
    )
}

/// What the planner says in [`Mode::NoPlan`]: a plan in words, with no JSON.
pub(super) const NO_PLAN: &str = "Happy to help! First I would look into the company, then find a \
                       time in your calendar, write a short email proposing the meeting, \
                       and send it once you have read it. Shall I go ahead?";

/// How many competitors a delegating plan researches, each in a child saga.
const COMPETITORS: usize = 3;

/// The planner's answer: a plan for the example's agents (see the module doc), in a
/// fenced block amid prose; with `bad`, with a step for an agent the example lacks.
/// `prompt` is the request, which names the company (between the first quotes).
pub(super) fn plan(seed: u64, key: &str, prompt: &str, bad: bool) -> String {
    let company = json!({ "$from": "/input/company" });
    let undo = |destination: &str, step: &str| {
        json!({
            "destination": destination,
            "command": { "op": "undo", "id": { "$from": format!("/results/{step}/id") } }
        })
    };
    let research = json!({
        "name": "research",
        "destination": "research",
        "command": { "op": "do", "company": company },
        "nothing_to_undo": true
    });
    let slot = json!({
        "name": "reserve_calendar_slot",
        "destination": "calendar",
        "command": { "op": "do", "company": company },
        "compensate": undo("calendar", "reserve_calendar_slot")
    });
    // Which plan: no slot, the slot beside the research, or after it, or no slot and
    // the research beside three child sagas, each researching a competitor.
    let shape = (unit(seed, key, 0, "plan") * 4.0) as u8;
    let mut draft = json!({
        "op": "do",
        "company": company,
        "findings": { "$from": "/results/research/text" }
    });
    if shape == 1 || shape == 2 {
        draft["slot"] = json!({ "$from": "/results/reserve_calendar_slot/text" });
    }
    let mut steps = match shape {
        0 => vec![research],
        1 => vec![json!({ "parallel": [research, slot] })],
        2 => vec![research, slot],
        _ => {
            let name = prompt.split('"').nth(1).unwrap_or("the company");
            let mut group = vec![research];
            let mut notes = Vec::new();
            for n in 1..=COMPETITORS {
                let step = format!("competitor_{n}");
                notes.push(json!({ "$from": format!("/results/{step}/results/research/text") }));
                group.push(json!({
                    "name": step,
                    "saga": "competitor_research",
                    "input": { "company": format!("{name} rival {n}") }
                }));
            }
            draft["competitors"] = json!(notes);
            vec![json!({ "parallel": group })]
        }
    };
    steps.extend([
        json!({
            "name": "draft_email",
            "destination": "drafts",
            "command": draft,
            "compensate": undo("drafts", "draft_email")
        }),
        json!({ "name": "approval", "wait_for": "approval" }),
        json!({
            "name": "send_email",
            "destination": "email",
            "command": {
                "op": "do",
                "company": company,
                "draft": { "$from": "/results/draft_email/text" }
            },
            "pivot": true
        }),
        json!({
            "name": "create_crm_record",
            "destination": "crm",
            "command": {
                "op": "do",
                "company": company,
                "approved_by": { "$from": "/results/approval/by" }
            }
        }),
    ]);
    if bad {
        steps.insert(
            1,
            json!({
                "name": "notify_team",
                "destination": "slack",
                "command": { "channel": "#sales", "text": { "$from": "/results/research/text" } },
                "nothing_to_undo": true
            }),
        );
    }
    let plan = serde_json::to_string_pretty(&json!({ "steps": steps })).expect("JSON");
    let opening = match shape {
        0 => "Here is a plan. I left the calendar out: the email can suggest a time instead.",
        1 => "Here is a plan: the research and the calendar slot can happen at the same time.",
        2 => "Sure! Here is the plan, step by step.",
        _ => {
            "Here is a plan: I research the company while three of its competitors are \
              researched on their own, and the email can draw on all of it."
        }
    };
    format!(
        "{opening}\n\n```json\n{plan}\n```\n\nThe email waits for your approval before it \
         goes out; if anything fails before then, what was reserved or drafted is undone."
    )
}

/// The answer of a competitor's research's planner: one step, `research`, in a fenced
/// block amid prose.
pub(super) fn research_plan() -> String {
    let plan = json!({ "steps": [{
        "name": "research",
        "destination": "research",
        "command": { "op": "do", "company": { "$from": "/input/company" } },
        "nothing_to_undo": true
    }]});
    let plan = serde_json::to_string_pretty(&plan).expect("JSON");
    format!("One look at the company will do.\n\n```json\n{plan}\n```\n")
}

/// Who asks for a plan.
#[derive(Clone, Copy)]
pub(super) enum Planner {
    /// The assistant's planner ([`PLANNER_ROLE`]).
    Assistant,
    /// A competitor's research's planner ([`RESEARCH_PLANNER_ROLE`]).
    Research,
}

impl Planner {
    /// Which planner asks in a chat's `messages`, by how its system prompt starts, if
    /// one does.
    pub(super) fn of(messages: &[Value]) -> Option<Planner> {
        let system = messages
            .iter()
            .find(|m| m["role"] == "system")
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default();
        if system.starts_with(PLANNER_ROLE) {
            Some(Planner::Assistant)
        } else if system.starts_with(RESEARCH_PLANNER_ROLE) {
            Some(Planner::Research)
        } else {
            None
        }
    }
}
