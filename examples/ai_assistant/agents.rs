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
// What the agents record.

/// Where an agent records what it made (a row per saga, with a `status`), and how that
/// is undone.
#[derive(Clone, Copy)]
pub(super) struct Effect {
    pub(super) table: &'static str,
    /// The row's `INSERT`, once per saga: its parameters the saga, the text, and for an
    /// undoable effect its id.
    pub(super) insert: &'static str,
    /// An undoable effect: the column of its id, and the status that undoes it.
    pub(super) undo: Option<(&'static str, &'static str)>,
}

impl Effect {
    /// Records what was made, once per saga (a command sent again finds the saga's
    /// row), with the id of the saga's row if it has one.
    pub(super) async fn record(
        self,
        ctx: &mut AgentContext<'_>,
        saga: &str,
        text: String,
    ) -> Result<Made, StepError> {
        let Some((id_column, _)) = self.undo else {
            support::exec(ctx.conn(), self.insert, &[saga, &text]).await?;
            return Ok(Made { text, id: None });
        };
        let id = ctx.message_id().to_string();
        support::exec(ctx.conn(), self.insert, &[saga, &text, &id]).await?;
        let sql = format!("SELECT {id_column} FROM {} WHERE saga_id = ?", self.table);
        let id = support::fetch_text(ctx.conn(), &sql, &[saga]).await?;
        Ok(Made { text, id })
    }

    /// Undoes what the step made: the row its reply named, or, when its outcome is
    /// unknown, whatever row the saga has here. Nothing to undo is success.
    pub(super) async fn undo(
        self,
        ctx: &mut AgentContext<'_>,
        saga: &str,
        id: Option<String>,
    ) -> Result<Made, StepError> {
        if let Some((id_column, undone)) = self.undo {
            // The id comes from the plan, which came from a model: it undoes a row of
            // this saga or nothing.
            let sql = match &id {
                Some(_) => format!(
                    "UPDATE {} SET status = '{undone}' WHERE saga_id = ? AND {id_column} = ?",
                    self.table
                ),
                None => format!(
                    "UPDATE {} SET status = '{undone}' WHERE saga_id = ?",
                    self.table
                ),
            };
            let params: Vec<&str> = std::iter::once(saga).chain(id.as_deref()).collect();
            support::exec(ctx.conn(), &sql, &params).await?;
        }
        Ok(Made {
            text: "undone".into(),
            id,
        })
    }
}

// ---------------------------------------------------------------------------------
// The agents that only write to the database.

#[derive(Clone, Copy)]
pub(super) enum Skill {
    Calendar,
    Email,
    Crm,
    FollowUp,
}

impl Skill {
    pub(super) fn destination(self) -> &'static str {
        match self {
            Skill::Calendar => CALENDAR,
            Skill::Email => EMAIL,
            Skill::Crm => CRM,
            Skill::FollowUp => FOLLOW_UPS,
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
            Skill::FollowUp => FOLLOW_UP_DRAFTED,
        }
    }
}

/// The follow-up, drafted because no reply came in time.
const FOLLOW_UP_DRAFTED: Effect = Effect {
    table: "assistant_follow_ups",
    insert: "INSERT INTO assistant_follow_ups (saga_id, status, note) VALUES (?, 'drafted', ?) ON CONFLICT (saga_id) DO NOTHING",
    undo: None,
};

/// No follow-up: the company replied.
const FOLLOW_UP_REPLIED: Effect = Effect {
    table: "assistant_follow_ups",
    insert: "INSERT INTO assistant_follow_ups (saga_id, status, note) VALUES (?, 'replied', ?) ON CONFLICT (saga_id) DO NOTHING",
    undo: None,
};

/// The reply a follow-up's command carries, if one came: the wait for it ended by its
/// signal (its data); `null` if it ended by time (its fold, which records the data at
/// `/results/<wait>`, was not called). A wake-up's own output, should a plan point at
/// it, is no reply either.
fn reply_of(task: &Task) -> Option<String> {
    let reply = task.reply.as_ref().filter(|r| !r.is_null())?;
    if reply.get("woke").is_some() {
        return None;
    }
    Some(match reply.get("text").and_then(Value::as_str) {
        Some(text) => text.to_owned(),
        None => reply.to_string(),
    })
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
        let (effect, produced) = match self.skill {
            Skill::Calendar => (effect, format!("{} Tue 10:00", task.company)),
            Skill::Email => (effect, task.draft.unwrap_or_default()),
            Skill::Crm => (
                effect,
                match task.approved_by {
                    Some(by) => format!("contacted {} (email approved by {by})", task.company),
                    None => format!("contacted {}", task.company),
                },
            ),
            Skill::FollowUp => match reply_of(&task) {
                Some(reply) => (
                    FOLLOW_UP_REPLIED,
                    format!("{} replied: {reply} (no follow-up)", task.company),
                ),
                None => (
                    FOLLOW_UP_DRAFTED,
                    format!(
                        "Following up with {}: did you have a chance to read my email? \
                         Happy to find a time that suits you.",
                        task.company
                    ),
                ),
            },
        };
        effect.record(ctx, &saga, produced).await
    }
}
