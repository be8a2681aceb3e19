//! AI assistant: "research company X, draft an email, schedule a meeting" as a saga of
//! specialised agents.
//!
//! ```sh
//! cargo run --release --example ai_assistant -- --sagas 50 --fail-rate 0.2 --seed 1
//! cargo run --release --example ai_assistant -- --sagas 0      # finish a killed run
//! ```
//!
//! Steps: `research` (read-only: nothing to undo), `reserve_calendar_slot`
//! (compensation `cancel_slot`), `draft_email` (compensation `discard_draft`),
//! `send_email` (the pivot: an email cannot be unsent), `create_crm_record` (after the
//! pivot, retried until it succeeds). Effects live in `assistant_research`,
//! `assistant_calendar_slots`, `assistant_drafts`, `assistant_emails` and
//! `assistant_crm_records`, one row per saga at most.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use agentsaga::prelude::*;
use clap::Parser;
use serde::{Deserialize, Serialize};

#[derive(Parser, Debug)]
#[command(about = "An AI assistant's request as a saga of specialised agents")]
struct Args {
    #[command(flatten)]
    common: support::CommonArgs,
}

/// The saga's data: the request, and what the agents produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Request {
    company: String,
    #[serde(default)]
    findings: Option<String>,
    #[serde(default)]
    slot: Option<String>,
    #[serde(default)]
    draft: Option<String>,
}

/// A command that is either done or undone by the same agent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Command {
    Do(Request),
    Undo,
}

/// What each specialised agent does, and where it records it.
#[derive(Clone, Copy)]
enum Skill {
    Research,
    Calendar,
    Drafts,
    Email,
    Crm,
}

impl Skill {
    fn destination(self) -> &'static str {
        match self {
            Skill::Research => "research",
            Skill::Calendar => "calendar",
            Skill::Drafts => "drafts",
            Skill::Email => "email",
            Skill::Crm => "crm",
        }
    }

    /// (insert of the effect, its undo)
    fn sql(self) -> (&'static str, Option<&'static str>) {
        match self {
            Skill::Research => (
                "INSERT INTO assistant_research (saga_id, status, summary) VALUES ($1, 'done', $2) ON CONFLICT (saga_id) DO NOTHING",
                None,
            ),
            Skill::Calendar => (
                "INSERT INTO assistant_calendar_slots (saga_id, status, slot) VALUES ($1, 'reserved', $2) ON CONFLICT (saga_id) DO NOTHING",
                Some("UPDATE assistant_calendar_slots SET status = 'cancelled' WHERE saga_id = $1"),
            ),
            Skill::Drafts => (
                "INSERT INTO assistant_drafts (saga_id, status, body) VALUES ($1, 'drafted', $2) ON CONFLICT (saga_id) DO NOTHING",
                Some("UPDATE assistant_drafts SET status = 'discarded' WHERE saga_id = $1"),
            ),
            Skill::Email => (
                "INSERT INTO assistant_emails (saga_id, status, body) VALUES ($1, 'sent', $2) ON CONFLICT (saga_id) DO NOTHING",
                None,
            ),
            Skill::Crm => (
                "INSERT INTO assistant_crm_records (saga_id, status, note) VALUES ($1, 'created', $2) ON CONFLICT (saga_id) DO NOTHING",
                None,
            ),
        }
    }
}

struct SkillAgent {
    skill: Skill,
    seed: u64,
    fail_rate: f64,
}

#[async_trait::async_trait]
impl Agent for SkillAgent {
    type Command = Command;
    type Reply = String;

    fn destination(&self) -> &str {
        self.skill.destination()
    }

    async fn handle(&self, ctx: &mut AgentContext<'_>, cmd: Command) -> Result<String, StepError> {
        let saga = ctx
            .saga_id()
            .map(|s| s.to_string())
            .ok_or_else(|| StepError::fatal("no saga id"))?;
        let (insert, undo) = self.skill.sql();
        let req = match cmd {
            Command::Undo => {
                if let Some(undo) = undo {
                    support::exec(ctx.conn(), undo, &[&saga]).await?;
                }
                return Ok("undone".into());
            }
            Command::Do(req) => req,
        };
        let r = support::roll(
            self.seed,
            &ctx.message_id().to_string(),
            self.skill.destination(),
        );
        match self.skill {
            // The model provider rate-limits now and then.
            _ if r < self.fail_rate * 0.6 => {
                return Err(StepError::retryable("model provider rate-limited"));
            }
            // No free slot in the calendar: nothing to schedule, undo the rest.
            Skill::Calendar if r < self.fail_rate => {
                return Err(StepError::fatal(format!(
                    "no free slot with {}",
                    req.company
                )));
            }
            Skill::Drafts if r < self.fail_rate => {
                return Err(StepError::fatal(
                    "the draft was flagged by the content policy",
                ));
            }
            _ => {}
        }
        let produced = match self.skill {
            Skill::Research => format!("{} builds saga runtimes", req.company),
            Skill::Calendar => format!("{} Tue 10:00", req.company),
            Skill::Drafts => format!(
                "Dear {}, {} — shall we meet {}?",
                req.company,
                req.findings.as_deref().unwrap_or("we read about you"),
                req.slot.as_deref().unwrap_or("soon")
            ),
            Skill::Email => req.draft.clone().unwrap_or_default(),
            Skill::Crm => format!("contacted {}", req.company),
        };
        support::exec(ctx.conn(), insert, &[&saga, &produced]).await?;
        Ok(produced)
    }
}

const DDL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS assistant_research (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status = 'done'), summary TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS assistant_calendar_slots (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status IN ('reserved', 'cancelled')), slot TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS assistant_drafts (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status IN ('drafted', 'discarded')), body TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS assistant_emails (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status = 'sent'), body TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS assistant_crm_records (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status = 'created'), note TEXT NOT NULL)",
];

fn definition() -> anyhow::Result<agentsaga::saga::SagaDefinition> {
    let retry = RetryPolicy::new(Duration::from_millis(50), Duration::from_secs(1), 5);
    let step = |name: &str, skill: Skill| {
        Step::<Request>::new(name, skill.destination())
            .command(|r: &Request| Command::Do(r.clone()))
            .retry(retry)
            .timeout(Duration::from_secs(20))
    };
    Ok(Saga::<Request>::builder("ai_assistant", 1)
        .step(
            step("research", Skill::Research)
                .on_reply(|r: &mut Request, findings: String| r.findings = Some(findings))
                .nothing_to_undo(),
        )
        .step(
            step("reserve_calendar_slot", Skill::Calendar)
                .on_reply(|r: &mut Request, slot: String| r.slot = Some(slot))
                .compensate("calendar", |_: &Request| Command::Undo),
        )
        .step(
            step("draft_email", Skill::Drafts)
                .on_reply(|r: &mut Request, draft: String| r.draft = Some(draft))
                .compensate("drafts", |_: &Request| Command::Undo),
        )
        .pivot(step("send_email", Skill::Email))
        .step(step("create_crm_record", Skill::Crm))
        .build()?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let telemetry = support::init_telemetry("ai_assistant")?;
    let common = &args.common;
    common.validate()?;
    let url = common.url("ai_assistant.db");
    let (seed, fail_rate) = (common.seed, common.fail_rate);
    let mut builder = Runtime::builder().database(&url).saga(definition()?);
    for skill in [
        Skill::Research,
        Skill::Calendar,
        Skill::Drafts,
        Skill::Email,
        Skill::Crm,
    ] {
        builder = builder.agent(SkillAgent {
            skill,
            seed,
            fail_rate,
        });
    }
    let runtime = support::configure(builder, common).start().await?;
    let companies = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Stark"];
    support::run(runtime, common, &url, DDL, "ai_assistant", |i| Request {
        company: format!("{} #{i}", companies[(i % 6) as usize]),
        findings: None,
        slot: None,
        draft: None,
    })
    .await?;
    telemetry.shutdown().await;
    Ok(())
}
