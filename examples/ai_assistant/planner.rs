//! The planner.

use super::*;

/// The destination of the planner agent, and the name of the saga's one fixed step.
pub(super) const PLANNER: &str = "planner";
pub(super) const PLAN_STEP: &str = "plan";
/// The saga an assistant's plan may delegate a competitor's research to (a child saga
/// of its own, with its own planner, at this destination).
pub(super) const COMPETITOR_RESEARCH: &str = "competitor_research";
pub(super) const RESEARCH_PLANNER: &str = "research_planner";
/// The most child sagas one assistant's plan may start.
pub(super) const MAX_CHILDREN: usize = 3;
/// A child stage's timeout, in step timeouts: it bounds the whole child (its planner's
/// step and its plan's).
pub(super) const CHILD_TIMEOUTS: u32 = 3;
/// The agents a plan may send commands (and compensations) to.
pub(super) const RESEARCH: &str = "research";
pub(super) const CALENDAR: &str = "calendar";
pub(super) const DRAFTS: &str = "drafts";
pub(super) const EMAIL: &str = "email";
pub(super) const CRM: &str = "crm";
pub(super) const AGENTS: [&str; 5] = [RESEARCH, CALENDAR, DRAFTS, EMAIL, CRM];
/// The signal a person sends to let the email go.
pub(super) const APPROVAL: &str = "approval";
/// Attempts of each step, the planner's and the plan's, for retryable failures.
pub(super) const ATTEMPTS: u32 = 5;

/// What the planner is told, after its role ([`llm_stub::PLANNER_ROLE`]): the plan
/// format and the agents it may use.
pub(super) const PLANNER_RULES: &str = r#"Answer with the plan that carries out the user's request, as JSON in a ```json fenced block: {"steps": [<stage>, ...]}. Stages run in order; a stage is one step, or {"parallel": [<step>, ...]} for steps that need nothing from each other.
A step is {"name": "<unique snake_case name>", "destination": "<agent>", "command": <JSON>} with how to undo it: "compensate": {"destination": "<agent>", "command": <JSON>}, or "nothing_to_undo": true for a step that changes nothing. The one step that cannot be undone is marked "pivot": true; the steps after it have no undo (they are retried until they succeed). A person's approval is the step {"name": "approval", "wait_for": "approval"}.
In a command, {"$from": "/input/company"} stands for the company of the request, {"$from": "/results/<step>/text"} for what the step <step> of an earlier stage produced, and, in a compensation, {"$from": "/results/<its own step>/id"} for the id of what its step created.
The agents and their commands:
- research: {"op": "do", "company": ...}: notes on the company (its text). Changes nothing.
- calendar: {"op": "do", "company": ...}: reserves a meeting slot (its text: the slot; its id). Undone by {"op": "undo", "id": ...} sent to calendar.
- drafts: {"op": "do", "company": ..., "findings": <the notes>, "slot": <the slot, if one was reserved>, "competitors": [<a competitor's notes>, ...] (if any were researched)}: writes the email (its text: the body; its id). Undone by {"op": "undo", "id": ...} sent to drafts.
- email: {"op": "do", "company": ..., "draft": <the body>}: sends the email. It cannot be unsent: it is the pivot, and the approval comes in a stage before it.
- crm: {"op": "do", "company": ..., "approved_by": {"$from": "/results/approval/by"}}: records the contact, after the email.
To learn about the company's competitors, a plan may delegate, at most three times, each competitor's research to a saga of its own: the step {"name": "<unique name>", "saga": "competitor_research", "input": {"company": "<the competitor's name>"}}, best in a parallel group beside the research. It has no "destination" and no undo to give (it is undone as a whole); the competitor's notes are then {"$from": "/results/<its step>/results/research/text"}.
Use no other agent, no other saga and no other field."#;

/// What the planner of a competitor's research is told, after its role
/// ([`llm_stub::RESEARCH_PLANNER_ROLE`]).
pub(super) const RESEARCH_PLANNER_RULES: &str = r#"Answer with the plan that researches the company of the request, as JSON in a ```json fenced block: {"steps": [<stage>, ...]}. Stages run in order; a stage is one step, or {"parallel": [<step>, ...]}.
A step is {"name": "<unique snake_case name>", "destination": "research", "command": {"op": "do", "company": {"$from": "/input/company"}}, "nothing_to_undo": true}: the research agent's notes on the company (its text). It changes nothing.
The notes the request is answered with are the step named "research"'s. Use no other agent, no waits and no other field."#;

/// Which saga a [`Planner`] plans for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Planning {
    /// The assistant's request (`ai_assistant`).
    Assistant,
    /// A competitor's research, delegated by an assistant's plan (`competitor_research`).
    Competitor,
}

impl Planning {
    pub(super) fn destination(self) -> &'static str {
        match self {
            Planning::Assistant => PLANNER,
            Planning::Competitor => RESEARCH_PLANNER,
        }
    }

    /// The planner's system prompt.
    pub(super) fn prompt(self) -> String {
        match self {
            Planning::Assistant => format!("{} {PLANNER_RULES}", llm_stub::PLANNER_ROLE),
            Planning::Competitor => format!(
                "{} {RESEARCH_PLANNER_RULES}",
                llm_stub::RESEARCH_PLANNER_ROLE
            ),
        }
    }

    /// The request the planner is asked to plan.
    pub(super) fn request(self, input: &Input) -> String {
        match self {
            Planning::Assistant => format!(
                "Plan this request about the company \"{}\": learn about the company, propose a \
                 meeting to them by email (reserving a slot in my calendar if that helps), send \
                 the email once I approve it, and record the contact in the CRM.",
                input.company
            ),
            Planning::Competitor => format!(
                "Plan the research of the company \"{}\", a competitor of a company we are \
                 writing to.",
                input.company
            ),
        }
    }

    /// The rules of this saga's plans beyond the engine's.
    pub(super) fn house_rules(self, plan: &Plan) -> Result<(), String> {
        match self {
            Planning::Assistant => house_rules(plan),
            Planning::Competitor => research_rules(plan),
        }
    }
}

/// The steps of `plan`, parallel members included, to change.
pub(super) fn steps_mut(plan: &mut Plan) -> impl Iterator<Item = &mut PlanStep> {
    plan.steps.iter_mut().flat_map(|stage| match stage {
        PlanStage::Step(s) => std::slice::from_mut(s),
        PlanStage::Parallel { parallel } => parallel.as_mut_slice(),
    })
}

/// The assistant's own rules, beyond the engine's: exactly one email, sent by the
/// pivot, in a stage after a wait for a person's approval; at most [`MAX_CHILDREN`]
/// child sagas (each competitor's research costs LLM calls of its own).
pub(super) fn house_rules(plan: &Plan) -> Result<(), String> {
    let mut approved = false;
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
        approved |= stage
            .members()
            .iter()
            .any(|s| s.wait_for.as_deref() == Some(APPROVAL));
    }
    if emails == 0 {
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

/// Asks the LLM for a plan; accepts it or says why not.
pub(super) struct Planner {
    pub(super) planning: Planning,
    pub(super) llm: Arc<Llm>,
    /// The saga it plans for: a plan must pass its checks.
    pub(super) saga: Arc<SagaDefinition>,
    /// The timeout of each command step of a plan ([`CHILD_TIMEOUTS`] of them for a
    /// child saga's step).
    pub(super) step_timeout: Duration,
}

/// A plan the planner accepted, and the model's answer it was read from.
pub(super) struct Accepted {
    pub(super) plan: Plan,
    pub(super) answer: String,
}

impl Planner {
    /// The plan in the model's answer, with the assistant's timeouts and attempts, if it
    /// passes the saga's rules and the assistant's; else why not.
    pub(super) fn accept(&self, answer: &str) -> Result<Plan, String> {
        let why = |e: agentsaga::saga::Error| match e {
            agentsaga::saga::Error::InvalidPlan(why) => why,
            e => e.to_string(),
        };
        let mut plan = Plan::from_text(answer).map_err(why)?;
        // Timeouts and retries are the assistant's to set, whatever the model wrote:
        // each command gets the step timeout and the saga's retry policy, a child saga
        // (its planner's step and its plan's) a few step timeouts; a person takes the
        // time they take.
        let ms = |t: Duration| u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
        let timeout_ms = ms(self.step_timeout);
        let child_timeout_ms = ms(self.step_timeout.saturating_mul(CHILD_TIMEOUTS));
        for step in steps_mut(&mut plan) {
            step.timeout_ms = match (&step.wait_for, &step.saga) {
                (Some(_), _) => None,
                (None, Some(_)) => Some(child_timeout_ms),
                (None, None) => Some(timeout_ms),
            };
            step.max_attempts = None;
        }
        self.saga.check_plan(&plan).map_err(why)?;
        self.planning.house_rules(&plan)?;
        Ok(plan)
    }
}

#[async_trait::async_trait]
impl CallingAgent for Planner {
    type Command = Input;
    type Output = Accepted;
    /// The plan, which the engine checks again and stores at `/plan` in the saga data.
    type Reply = Plan;

    fn destination(&self) -> &str {
        self.planning.destination()
    }

    async fn call(&self, ctx: &CallContext<'_>, input: &Input) -> Result<Accepted, StepError> {
        let request = self.planning.request(input);
        let answer = self
            .llm
            .chat(ctx, &self.planning.prompt(), &request)
            .await?;
        // A plan that breaks a rule is the model's error: asking again with the same
        // idempotency key would get the same answer. The step fails, with the reason.
        let plan = self
            .accept(&answer)
            .map_err(|why| StepError::fatal(format!("the planner's invalid plan: {why}")))?;
        Ok(Accepted { plan, answer })
    }

    async fn record(
        &self,
        ctx: &mut AgentContext<'_>,
        _input: Input,
        accepted: Accepted,
    ) -> Result<Plan, StepError> {
        let saga = saga_of(ctx)?;
        let steps: Vec<&str> = accepted
            .plan
            .steps
            .iter()
            .flat_map(PlanStage::members)
            .map(|s| s.name.as_str())
            .collect();
        let plan = serde_json::to_string(&accepted.plan).map_err(StepError::fatal)?;
        support::exec(
            ctx.conn(),
            "INSERT INTO assistant_plans (saga_id, steps, plan, answer) VALUES ($1, $2, $3, $4) ON CONFLICT (saga_id) DO NOTHING",
            &[&saga, &steps.join(" "), &plan, &accepted.answer],
        )
        .await?;
        Ok(accepted.plan)
    }
}
