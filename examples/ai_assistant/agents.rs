//! The agents that ask the LLM.

use super::*;

#[derive(Clone, Copy)]
pub(super) enum Writing {
    Research,
    Draft,
}

impl Writing {
    pub(super) fn destination(self) -> &'static str {
        match self {
            Writing::Research => RESEARCH,
            Writing::Draft => DRAFTS,
        }
    }

    /// (system prompt, user prompt)
    pub(super) fn prompt(self, task: &Task) -> (&'static str, String) {
        match self {
            Writing::Research => (
                "You are the research agent of an executive assistant. Answer in at most \
                 three sentences of plain text.",
                format!(
                    "Research the company \"{}\": what does it do, and what recent fact is \
                     worth mentioning when writing to them?",
                    task.company
                ),
            ),
            Writing::Draft => (
                "You are the email-writing agent of an executive assistant. Write the body \
                 of a short, friendly email in plain text, without a subject line.",
                {
                    let mut user = format!(
                        "Write to {} proposing a meeting on {}. What we know about them: {}",
                        task.company,
                        task.slot.as_deref().unwrap_or("a day that suits them"),
                        task.findings.as_deref().unwrap_or("nothing yet")
                    );
                    let competitors: Vec<&str> = task
                        .competitors
                        .iter()
                        .flatten()
                        .filter_map(Option::as_deref)
                        .collect();
                    if !competitors.is_empty() {
                        user.push_str(" What we know about their competitors: ");
                        user.push_str(&competitors.join(" / "));
                    }
                    user
                },
            ),
        }
    }

    pub(super) fn effect(self) -> Effect {
        match self {
            Writing::Research => Effect {
                table: "assistant_research",
                insert: "INSERT INTO assistant_research (saga_id, status, summary) VALUES (?, 'done', ?) ON CONFLICT (saga_id) DO NOTHING",
                undo: None,
            },
            Writing::Draft => Effect {
                table: "assistant_drafts",
                insert: "INSERT INTO assistant_drafts (saga_id, status, body, draft_id) VALUES (?, 'drafted', ?, ?) ON CONFLICT (saga_id) DO NOTHING",
                undo: Some(("draft_id", "discarded")),
            },
        }
    }
}

pub(super) struct LlmAgent {
    pub(super) writing: Writing,
    pub(super) llm: Arc<Llm>,
}

#[async_trait::async_trait]
impl CallingAgent for LlmAgent {
    type Command = Command;
    /// The model's text; none for an undo, which asks no one.
    type Output = Option<String>;
    type Reply = Made;

    fn destination(&self) -> &str {
        self.writing.destination()
    }

    async fn call(&self, ctx: &CallContext<'_>, cmd: &Command) -> Result<Self::Output, StepError> {
        match cmd {
            Command::Undo { .. } => Ok(None),
            Command::Do(task) => {
                let (system, user) = self.writing.prompt(task);
                self.llm.chat(ctx, system, &user).await.map(Some)
            }
        }
    }

    async fn record(
        &self,
        ctx: &mut AgentContext<'_>,
        cmd: Command,
        output: Option<String>,
    ) -> Result<Made, StepError> {
        let saga = saga_of(ctx)?;
        let effect = self.writing.effect();
        match (cmd, output) {
            (Command::Undo { id }, _) => effect.undo(ctx, &saga, id).await,
            (Command::Do(_), Some(text)) => effect.record(ctx, &saga, text).await,
            (Command::Do(_), None) => Err(StepError::fatal("the LLM call brought nothing back")),
        }
    }
}

// ---------------------------------------------------------------------------------
// The agents that only write to the database.

#[derive(Clone, Copy)]
pub(super) enum Skill {
    Calendar,
    Email,
    Crm,
}

impl Skill {
    pub(super) fn destination(self) -> &'static str {
        match self {
            Skill::Calendar => CALENDAR,
            Skill::Email => EMAIL,
            Skill::Crm => CRM,
        }
    }

    pub(super) fn effect(self) -> Effect {
        match self {
            Skill::Calendar => Effect {
                table: "assistant_calendar_slots",
                insert: "INSERT INTO assistant_calendar_slots (saga_id, status, slot, event_id) VALUES (?, 'reserved', ?, ?) ON CONFLICT (saga_id) DO NOTHING",
                undo: Some(("event_id", "cancelled")),
            },
            Skill::Email => Effect {
                table: "assistant_emails",
                insert: "INSERT INTO assistant_emails (saga_id, status, body) VALUES (?, 'sent', ?) ON CONFLICT (saga_id) DO NOTHING",
                undo: None,
            },
            Skill::Crm => Effect {
                table: "assistant_crm_records",
                insert: "INSERT INTO assistant_crm_records (saga_id, status, note) VALUES (?, 'created', ?) ON CONFLICT (saga_id) DO NOTHING",
                undo: None,
            },
        }
    }
}

pub(super) struct SkillAgent {
    pub(super) skill: Skill,
    pub(super) seed: u64,
    pub(super) fail_rate: f64,
}

#[async_trait::async_trait]
impl Agent for SkillAgent {
    type Command = Command;
    type Reply = Made;

    fn destination(&self) -> &str {
        self.skill.destination()
    }

    async fn handle(&self, ctx: &mut AgentContext<'_>, cmd: Command) -> Result<Made, StepError> {
        let saga = saga_of(ctx)?;
        let effect = self.skill.effect();
        let task = match cmd {
            Command::Undo { id } => return effect.undo(ctx, &saga, id).await,
            Command::Do(task) => task,
        };
        let r = support::roll(
            self.seed,
            &ctx.message_id().to_string(),
            self.skill.destination(),
        );
        match self.skill {
            // The service rate-limits now and then.
            _ if r < self.fail_rate * 0.6 => {
                return Err(StepError::retryable(format!(
                    "{} service rate-limited",
                    self.skill.destination()
                )));
            }
            // No free slot in the calendar: nothing to schedule, undo the rest.
            Skill::Calendar if r < self.fail_rate => {
                return Err(StepError::fatal(format!(
                    "no free slot with {}",
                    task.company
                )));
            }
            _ => {}
        }
        let produced = match self.skill {
            Skill::Calendar => format!("{} Tue 10:00", task.company),
            Skill::Email => task.draft.unwrap_or_default(),
            Skill::Crm => match task.approved_by {
                Some(by) => format!("contacted {} (email approved by {by})", task.company),
                None => format!("contacted {}", task.company),
            },
        };
        effect.record(ctx, &saga, produced).await
    }
}
