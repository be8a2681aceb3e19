//! The assistant's runtime: its two sagas, its planners, its LLM agents and its
//! database agents, on a builder (shared with the test that runs it on
//! `agentsaga::testing::TestRuntime`).

use super::*;

/// How the assistant runs (the example's flags).
pub(super) struct Settings {
    /// Each step's timeout (an LLM request gets 3/4 of it).
    pub(super) step_timeout: Duration,
    /// Each request's budget of tokens out (0: none).
    pub(super) budget_tokens_out: u64,
    /// How long a saga waits for a reply before its follow-up.
    pub(super) follow_up_after: String,
    /// The LLM account's requests a minute, shared by its four destinations.
    pub(super) llm_rpm: u32,
    /// The database agents' failure injection.
    pub(super) seed: u64,
    pub(super) fail_rate: f64,
}

/// `builder` with the assistant's sagas and agents, asking `llm`.
///
/// # Errors
/// A saga that does not build, or a `follow_up_after` a plan's wait cannot take.
pub(super) fn assistant(
    builder: RuntimeBuilder,
    llm: &Arc<Llm>,
    s: &Settings,
) -> anyhow::Result<RuntimeBuilder> {
    let research = competitor_research(s.step_timeout)?;
    let budget = (s.budget_tokens_out > 0).then(|| Budget::new().tokens_out(s.budget_tokens_out));
    let saga = definition(s.step_timeout, &research, budget)?;
    // The wait for a reply the planner will set, checked as the engine checks a plan's.
    let wait = PlanStep::wait_for("await_reply", REPLY).or_after(s.follow_up_after.clone());
    if let Err(e) = saga.check_plan(&Plan::new().then(wait)) {
        anyhow::bail!("--follow-up-after: {e}");
    }
    let mut builder = builder.saga(saga.clone()).saga(research.clone());
    for llm_destination in [PLANNER, RESEARCH_PLANNER, RESEARCH, DRAFTS] {
        let share = RateLimit::requests_per_minute((s.llm_rpm / 4).max(1));
        builder = builder.rate_limit(llm_destination, share);
    }
    for (planning, saga) in [
        (Planning::Assistant, saga),
        (Planning::Competitor, research),
    ] {
        builder = builder.calling_agent(Planner {
            planning,
            llm: Arc::clone(llm),
            saga: Arc::new(saga),
            step_timeout: s.step_timeout,
            follow_up_after: s.follow_up_after.clone(),
        });
    }
    for writing in [Writing::Research, Writing::Draft] {
        builder = builder.calling_agent(LlmAgent {
            writing,
            llm: Arc::clone(llm),
        });
    }
    for skill in [Skill::Calendar, Skill::Email, Skill::Crm, Skill::FollowUp] {
        builder = builder.agent(SkillAgent {
            skill,
            seed: s.seed,
            fail_rate: s.fail_rate,
        });
    }
    Ok(builder)
}
