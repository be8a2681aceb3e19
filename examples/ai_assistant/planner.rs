//! The planner.

use super::*;

/// The destination of the planner agent, and the name of the saga's one fixed step.
pub(super) const PLANNER: &str = "planner";
pub(super) const PLAN_STEP: &str = "plan";
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
- drafts: {"op": "do", "company": ..., "findings": <the notes>, "slot": <the slot, if one was reserved>}: writes the email (its text: the body; its id). Undone by {"op": "undo", "id": ...} sent to drafts.
- email: {"op": "do", "company": ..., "draft": <the body>}: sends the email. It cannot be unsent: it is the pivot, and the approval comes in a stage before it.
- crm: {"op": "do", "company": ..., "approved_by": {"$from": "/results/approval/by"}}: records the contact, after the email.
Use no other agent and no other field."#;

/// The planner's system prompt.
pub(super) fn planner_prompt() -> String {
    format!("{} {PLANNER_RULES}", llm_stub::PLANNER_ROLE)
}

/// The steps of `plan`, parallel members included, to change.
pub(super) fn steps_mut(plan: &mut Plan) -> impl Iterator<Item = &mut PlanStep> {
    plan.steps.iter_mut().flat_map(|stage| match stage {
        PlanStage::Step(s) => std::slice::from_mut(s),
        PlanStage::Parallel { parallel } => parallel.as_mut_slice(),
    })
}

/// The assistant's own rules, beyond the engine's: exactly one email, sent by the
/// pivot, in a stage after a wait for a person's approval.
pub(super) fn house_rules(plan: &Plan) -> Result<(), String> {
    let mut approved = false;
    let mut emails = 0;
    for stage in &plan.steps {
        for s in stage.members() {
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

/// Asks the LLM for a plan; accepts it or says why not.
pub(super) struct Planner {
    pub(super) llm: Arc<Llm>,
    /// The saga it plans for: a plan must pass its checks.
    pub(super) saga: Arc<SagaDefinition>,
    /// The timeout of each command step of a plan.
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
        // each command gets the step timeout and the saga's retry policy; a person
        // takes the time they take.
        let timeout_ms = u64::try_from(self.step_timeout.as_millis()).unwrap_or(u64::MAX);
        for step in steps_mut(&mut plan) {
            step.timeout_ms = step.wait_for.is_none().then_some(timeout_ms);
            step.max_attempts = None;
        }
        self.saga.check_plan(&plan).map_err(why)?;
        house_rules(&plan)?;
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
        PLANNER
    }

    async fn call(&self, ctx: &CallContext<'_>, input: &Input) -> Result<Accepted, StepError> {
        let request = format!(
            "Plan this request about the company \"{}\": learn about the company, propose a \
             meeting to them by email (reserving a slot in my calendar if that helps), send \
             the email once I approve it, and record the contact in the CRM.",
            input.company
        );
        let answer = self.llm.chat(ctx, &planner_prompt(), &request).await?;
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
