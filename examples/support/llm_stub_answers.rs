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

/// Which turn of the planner a request of step `step` is: `plan` the first, `plan_<n>`
/// the n-th.
pub(super) fn turn_of(step: &str) -> usize {
    step.rsplit_once('_')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(1)
}

/// The planner's answer in turn `turn`: the first turn's stages (the research), the
/// second's (the rest), then `{"done": true}` (see the module doc), in a fenced block
/// amid prose; with `bad`, with a step for an agent the example lacks. The plan's
/// shape depends on the seed and the request's company alone, the same in every turn.
/// `prompt` is the request, which names the company (between the first quotes).
/// Given `follow_up` (a duration), the second turn ends with the wait for the reply
/// that ends after it and the follow-up.
pub(super) fn plan(
    seed: u64,
    saga: &str,
    (turn, follow_up): (usize, Option<&str>),
    prompt: &str,
    bad: bool,
) -> String {
    if turn > 2 && !bad {
        return "Everything is planned.\n\n```json\n{\"done\": true}\n```\n".to_owned();
    }
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
    // Which plan: no slot, the slot beside the research, or after it (in the second
    // turn), or no slot and the research beside three child sagas, each researching a
    // competitor.
    // Chosen by the request (its company, named in every turn's request), so that a
    // run's shapes are the same for the same seed, and both turns agree.
    let company_name = prompt.split('"').nth(1).unwrap_or(saga);
    let shape = (unit(seed, company_name, 0, "plan") * 4.0) as u8;
    let mut draft = json!({
        "op": "do",
        "company": company,
        "findings": { "$from": "/results/research/text" }
    });
    if shape == 1 || shape == 2 {
        draft["slot"] = json!({ "$from": "/results/reserve_calendar_slot/text" });
    }
    let name = prompt.split('"').nth(1).unwrap_or("the company");
    let mut group = vec![research];
    let mut notes = Vec::new();
    for n in (shape == 3)
        .then_some(1..=COMPETITORS)
        .into_iter()
        .flatten()
    {
        let step = format!("competitor_{n}");
        notes.push(json!({ "$from": format!("/results/{step}/results/research/text") }));
        group.push(json!({
            "name": step,
            "saga": "competitor_research",
            "input": { "company": format!("{name} rival {n}") }
        }));
    }
    if shape == 1 {
        group.push(slot.clone());
    }
    if shape == 3 {
        draft["competitors"] = json!(notes);
    }
    let mut steps = match (turn, group.len()) {
        (1, 1) => group,
        (1, _) => vec![json!({ "parallel": group })],
        _ if shape == 2 => vec![slot],
        _ => Vec::new(),
    };
    if turn == 2 {
        steps.extend(rest(draft, undo("drafts", "draft_email"), follow_up));
    }
    if bad {
        let at = steps.len().min(1);
        steps.insert(
            at,
            json!({
                "name": "notify_team",
                "destination": "slack",
                "command": { "channel": "#sales", "text": { "$from": "/results/research/text" } },
                "nothing_to_undo": true
            }),
        );
    }
    let plan = serde_json::to_string_pretty(&json!({ "steps": steps })).expect("JSON");
    let opening = match (turn, shape) {
        (1, 1) => "First the research; the calendar slot can be reserved at the same time.",
        (1, 3) => {
            "First I research the company while three of its competitors are researched \
             on their own; the email can draw on all of it."
        }
        (1, _) => "First, the research; I will plan the rest once I have read it.",
        (_, 0) => "With the research in hand: the email can suggest a time instead of a slot.",
        (_, 2) => "With the research in hand, here is the rest of the plan, step by step.",
        _ => "With the research in hand, here is the rest of the plan.",
    };
    let closing = match (turn, follow_up) {
        (2, Some(after)) => format!(
            " Once it is sent, I wait {after} for their reply, and draft a follow-up if \
             none came."
        ),
        _ => String::new(),
    };
    format!(
        "{opening}\n\n```json\n{plan}\n```\n\nThe email waits for your approval before it \
         goes out; if anything fails before then, what was reserved or drafted is \
         undone.{closing}"
    )
}

/// The stages after the research (and the slot): the draft (its command `draft`), the
/// approval, the email (the pivot), the CRM record; given `follow_up`, the wait for
/// the company's reply that ends after it, and the follow-up, which takes the reply
/// (`null` if none came).
fn rest(draft: Value, undo_draft: Value, follow_up: Option<&str>) -> Vec<Value> {
    let company = json!({ "$from": "/input/company" });
    let mut rest = vec![
        json!({
            "name": "draft_email",
            "destination": "drafts",
            "command": draft,
            "compensate": undo_draft
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
    ];
    if let Some(after) = follow_up {
        rest.push(json!({ "name": "await_reply", "wait_for": "reply", "or_after": after }));
        rest.push(json!({
            "name": "follow_up",
            "destination": "follow_ups",
            "command": {
                "op": "do",
                "company": company,
                "reply": { "$from": "/results/await_reply" }
            }
        }));
    }
    rest
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

/// What the stub decided to answer.
pub(super) enum Answer {
    Completion {
        content: Content,
        delay: Duration,
    },
    RateLimited,
    /// Past the account's limit: to try again after this long.
    OverLimit(Duration),
    Unavailable,
    Hang,
    BadShape,
    BadRequest,
}

/// What a completion's message says.
#[derive(Clone, Copy)]
pub(super) enum Content {
    /// A refusal, and no content.
    Refusal,
    /// An answer to the prompt (for a planner, a plan).
    Answer,
    /// A plan that names an agent the example does not have.
    BadPlan,
    /// Prose with no plan in it.
    NoPlan,
}

impl Answer {
    pub(super) fn label(&self) -> &'static str {
        match self {
            Answer::Completion { content, .. } => match content {
                Content::Answer => "200",
                Content::Refusal => "200 refusal",
                Content::BadPlan => "200 bad-plan",
                Content::NoPlan => "200 no-plan",
            },
            Answer::BadShape => "200 bad-shape",
            Answer::RateLimited => "429",
            Answer::OverLimit(_) => "429 limit",
            Answer::Unavailable => "503",
            Answer::Hang => "hang",
            Answer::BadRequest => "400",
        }
    }
}

/// The account's rate limit (GCRA): when the next request is due at the limit's
/// pace; a request earlier than that, less the burst, is refused.
#[derive(Default)]
pub(super) struct Pace {
    due: Option<std::time::Instant>,
}

impl Pace {
    /// Takes a request now, or says how long until it would be taken.
    pub(super) fn take(&mut self, per_minute: u32) -> Result<(), Duration> {
        let interval = Duration::from_secs(60) / per_minute.max(1);
        let burst = interval * (per_minute / 60).max(1);
        let now = std::time::Instant::now();
        let due = self.due.unwrap_or(now);
        if let Some(early) = due
            .checked_sub(burst)
            .and_then(|t| t.checked_duration_since(now))
            .filter(|d| !d.is_zero())
        {
            return Err(early);
        }
        self.due = Some(due.max(now) + interval);
        Ok(())
    }
}
