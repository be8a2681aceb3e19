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
pub(super) const FOLLOW_UPS: &str = "follow_ups";
pub(super) const AGENTS: [&str; 6] = [RESEARCH, CALENDAR, DRAFTS, EMAIL, CRM, FOLLOW_UPS];
/// The signal a person sends to let the email go.
pub(super) const APPROVAL: &str = "approval";
/// The signal of the company's reply to the email: an outside event, which agents may
/// send (the simulated inbox does), so a wait for it may end by time.
pub(super) const REPLY: &str = "reply";
/// Attempts of each step, the planner's and the plan's, for retryable failures.
pub(super) const ATTEMPTS: u32 = 5;
/// The assistant's planner's turns (`replan`): the research, the rest, then done.
pub(super) const TURNS: u32 = 3;

/// The saga: the planner's step, then whatever plan it returned, sending only to the
/// assistant's agents, and starting only `competitor_research` (see
/// [`competitor_research`]) as a child saga; the planner is asked again once the stages
/// of its turn have run, up to [`TURNS`] turns.
///
/// Version 4: version 3's plans ended with the CRM record. A version 4 plan may send to
/// `follow_ups` and wait for the company's `reply` by time (an agent's signal), which a
/// version 3 process does not know (no `follow_ups` agent; a wait for `reply` a
/// person's decision), so the version changes: a version 4 saga is run only by a
/// process that registers version 4, and a version 3 saga in flight waits for one that
/// registers version 3. (Version 3: version 2 ran one plan, made in one turn; a version 2 saga's
/// stored plan would read as the first turn of a version 3 saga.)
pub(super) fn definition(
    timeout: Duration,
    research: &SagaDefinition,
    budget: Option<Budget>,
) -> anyhow::Result<SagaDefinition> {
    let retry = RetryPolicy::new(Duration::from_millis(50), Duration::from_secs(1), ATTEMPTS);
    let builder = PlannedSaga::builder("ai_assistant", 4);
    let builder = match budget {
        Some(b) => builder.budget(b, OnBudgetSpent::Compensate),
        None => builder,
    };
    Ok(builder
        .destinations(AGENTS)
        // The company's reply: not a person's decision, so its wait may end by time.
        .agent_signals([REPLY])
        .child_sagas([research])
        // The plan's steps retry like the planner's; their timeouts the planner sets.
        .retry(retry)
        // Its command is the request, with the results so far; its reply, the stages it
        // adds, or done. Asking changes nothing.
        .planner(
            Step::<Value>::new(PLAN_STEP, PLANNER)
                .command(Ask::command)
                .retry(retry)
                .timeout(timeout)
                .nothing_to_undo(),
        )
        .replan(TURNS)
        .build()?)
}

/// A competitor's research, which an assistant's plan may delegate (a child saga): its
/// own planner's step (at [`RESEARCH_PLANNER`]), then the plan it returned, sending
/// only to the research agent (nothing to undo, no pivot: the parent undoes it as a
/// whole).
pub(super) fn competitor_research(timeout: Duration) -> anyhow::Result<SagaDefinition> {
    let retry = RetryPolicy::new(Duration::from_millis(50), Duration::from_secs(1), ATTEMPTS);
    Ok(PlannedSaga::builder(COMPETITOR_RESEARCH, 1)
        .destinations([RESEARCH])
        .retry(retry)
        .planner(
            Step::<Value>::new(PLAN_STEP, RESEARCH_PLANNER)
                .command(|data: &Value| data["input"].clone())
                .retry(retry)
                .timeout(timeout)
                .nothing_to_undo(),
        )
        .build()?)
}

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

    /// The request the planner is asked to plan: on a turn after the first (the
    /// assistant's), with the stages planned so far and the results they produced.
    /// `follow_up_after`: how long the assistant's plans wait for a reply.
    pub(super) fn request(self, ask: &Ask, follow_up_after: &str) -> String {
        let company = &ask.input.company;
        match self {
            Planning::Assistant => {
                let mut request = format!(
                    "Plan this request about the company \"{company}\": learn about the \
                     company, propose a meeting to them by email (reserving a slot in my \
                     calendar if that helps), send the email once I approve it, record \
                     the contact in the CRM, then wait {follow_up_after} for their reply \
                     and draft a follow-up if none came.\nThis is turn {} of {TURNS}.",
                    ask.turn()
                );
                if let Some(so_far) = &ask.plan {
                    let names: Vec<&str> = so_far
                        .steps
                        .iter()
                        .flat_map(PlanStage::members)
                        .map(|s| s.name.as_str())
                        .collect();
                    request.push_str(&format!(
                        " The steps planned so far, which have run: {}. Their results: {}",
                        names.join(", "),
                        ask.results
                    ));
                }
                request
            }
            Planning::Competitor => format!(
                "Plan the research of the company \"{company}\", a competitor of a company \
                 we are writing to."
            ),
        }
    }

    /// The rules of this saga's plans beyond the engine's, on the plan as it stands
    /// (`complete`: no turn will add to it).
    pub(super) fn house_rules(self, plan: &Plan, complete: bool) -> Result<(), String> {
        match self {
            Planning::Assistant => house_rules(plan, complete),
            Planning::Competitor => research_rules(plan),
        }
    }
}

/// What the planner's step is sent: the request (`/input`), and the saga as it stands
/// (`/results`, `/plan` and `/turns`: none on the first turn).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Ask {
    #[serde(flatten)]
    pub(super) input: Input,
    #[serde(default)]
    pub(super) results: Value,
    #[serde(default)]
    pub(super) plan: Option<Plan>,
    #[serde(default)]
    pub(super) turns: Option<Vec<usize>>,
}

impl Ask {
    /// The planner step's command: the saga data's request and what the turns so far
    /// planned and produced.
    pub(super) fn command(data: &Value) -> Value {
        let mut ask = data["input"].clone();
        for field in ["results", "plan", "turns"] {
            if let (Some(ask), Some(v)) = (ask.as_object_mut(), data.get(field)) {
                ask.insert(field.to_owned(), v.clone());
            }
        }
        ask
    }

    /// Which turn it is (1: the first, which makes the plan).
    pub(super) fn turn(&self) -> usize {
        self.turns.as_ref().map_or(0, Vec::len) + 1
    }
}

/// Does the model's answer say the plan is complete: `{"done": true}`, alone or in a
/// fenced block?
pub(super) fn says_done(answer: &str) -> bool {
    let done = |t: &str| {
        let t = t.trim().trim_start_matches("json");
        serde_json::from_str::<Value>(t).is_ok_and(|v| v.get("done") == Some(&Value::Bool(true)))
    };
    done(answer) || answer.split("```").skip(1).step_by(2).any(done)
}

/// The steps of `plan`, parallel members included, to change.
pub(super) fn steps_mut(plan: &mut Plan) -> impl Iterator<Item = &mut PlanStep> {
    plan.steps.iter_mut().flat_map(|stage| match stage {
        PlanStage::Step(s) => std::slice::from_mut(s),
        PlanStage::Parallel { parallel } => parallel.as_mut_slice(),
    })
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
    /// How long a wait for the company's reply lasts (`--follow-up-after`).
    pub(super) follow_up_after: String,
}

/// What the planner accepted from the model's answer (`answer`): the stages its turn
/// adds (`None`: it is done), and the plan of every turn with them.
pub(super) struct Accepted {
    pub(super) added: Option<Plan>,
    pub(super) plan: Plan,
    pub(super) answer: String,
}

impl Planner {
    /// The stages in the model's answer to `ask`, with the assistant's timeouts and
    /// attempts (and how long a wait for a reply lasts), or its `{"done": true}` (not
    /// in the first turn), if the plan of every turn with them passes the saga's rules
    /// and the assistant's; else why not. The rules that need the whole plan (an email)
    /// apply once it is complete: the planner says it is done, or its last turn
    /// answered.
    pub(super) fn accept(&self, ask: &Ask, answer: &str) -> Result<Accepted, String> {
        let why = |e: agentsaga::saga::Error| match e {
            agentsaga::saga::Error::InvalidPlan(why) => why,
            e => e.to_string(),
        };
        let (turn, so_far) = (ask.turn(), ask.plan.clone());
        let answer = answer.to_owned();
        if turn > 1 && says_done(&answer) {
            let plan = so_far.unwrap_or_default();
            self.planning.house_rules(&plan, true)?;
            let added = None;
            return Ok(Accepted {
                added,
                plan,
                answer,
            });
        }
        let mut added = Plan::from_text(&answer).map_err(why)?;
        // Timeouts and retries are the assistant's to set, whatever the model wrote:
        // each command gets the step timeout and the saga's retry policy, a child saga
        // (its planner's step and its plan's) a few step timeouts; a person takes the
        // time they take.
        let ms = |t: Duration| u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
        let timeout_ms = ms(self.step_timeout);
        let child_timeout_ms = ms(self.step_timeout.saturating_mul(CHILD_TIMEOUTS));
        for step in steps_mut(&mut added) {
            step.timeout_ms = match (&step.wait_for, &step.saga) {
                (Some(_), _) => None,
                (None, Some(_)) => Some(child_timeout_ms),
                (None, None) => Some(timeout_ms),
            };
            step.max_attempts = None;
        }
        // So is how long the company has to reply before the follow-up.
        set_follow_up_after(&mut added, &self.follow_up_after);
        // The engine checks the turns as one plan: so does the planner.
        let mut plan = so_far.unwrap_or_default();
        plan.steps.extend(added.steps.iter().cloned());
        self.saga.check_plan(&plan).map_err(why)?;
        let last = self.planning == Planning::Competitor || turn >= TURNS as usize;
        self.planning.house_rules(&plan, last)?;
        let added = Some(added);
        Ok(Accepted {
            added,
            plan,
            answer,
        })
    }
}

#[async_trait::async_trait]
impl CallingAgent for Planner {
    type Command = Ask;
    type Output = Accepted;
    /// The stages the turn adds, as a plan, or `{"done": true}`, which the engine
    /// checks again with the turns before it and stores at `/plan`.
    type Reply = Value;

    fn destination(&self) -> &str {
        self.planning.destination()
    }

    async fn call(&self, ctx: &CallContext<'_>, ask: &Ask) -> Result<Accepted, StepError> {
        // Once the plan so far is complete (it sends the email, the pivot), a turn that
        // fails would leave a saga that cannot turn back stuck: a refusal or an invalid
        // answer then ends the planning instead (a retryable failure is retried).
        let so_far = ask.plan.as_ref();
        let complete = so_far.is_some_and(|p| self.planning.house_rules(p, true).is_ok());
        let done = |why: String| {
            tracing::warn!(turn = ask.turn(), %why, "the plan is complete: planning ends");
            let plan = so_far.cloned().unwrap_or_default();
            let answer = format!("(done: {why})");
            Ok(Accepted {
                added: None,
                plan,
                answer,
            })
        };
        let request = self.planning.request(ask, &self.follow_up_after);
        let answer = match self.llm.chat(ctx, &self.planning.prompt(), &request).await {
            Err(StepError::Fatal(why)) if complete => return done(why),
            answer => answer?,
        };
        // A plan that breaks a rule is the model's error: asking again with the same
        // idempotency key would get the same answer. The step fails, with the reason.
        match self.accept(ask, &answer) {
            Err(why) if complete => done(format!("the planner's invalid plan: {why}")),
            accepted => accepted
                .map_err(|why| StepError::fatal(format!("the planner's invalid plan: {why}"))),
        }
    }

    /// Records the plan of every turn so far (once per turn: a turn that adds nothing
    /// leaves the row as it is), with the answers it was read from.
    async fn record(
        &self,
        ctx: &mut AgentContext<'_>,
        _ask: Ask,
        accepted: Accepted,
    ) -> Result<Value, StepError> {
        let Some(added) = accepted.added else {
            return Ok(serde_json::json!({ "done": true }));
        };
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
            "INSERT INTO assistant_plans (saga_id, steps, plan, answer) VALUES (?, ?, ?, ?) \
             ON CONFLICT (saga_id) DO UPDATE SET steps = excluded.steps, plan = excluded.plan, \
             answer = assistant_plans.answer || '\n\n' || excluded.answer \
             WHERE length(excluded.steps) > length(assistant_plans.steps)",
            &[&saga, &steps.join(" "), &plan, &accepted.answer],
        )
        .await?;
        serde_json::to_value(&added).map_err(StepError::fatal)
    }
}
