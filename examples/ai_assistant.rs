//! AI assistant: "research company X, draft an email, schedule a meeting" as a saga of
//! specialised agents, two of which ask an LLM.
//!
//! ```sh
//! cargo run --release --example ai_assistant -- --sagas 50 --fail-rate 0.2 --seed 1 --auto-approve
//! cargo run --release --example ai_assistant -- --sagas 5     # ends with 5 waiting for approval
//! cargo run -p agentsaga-cli -- --database-url sqlite://ai_assistant.db sagas signal ID approval --data '{"by":"you"}'
//! cargo run --release --example ai_assistant -- --sagas 0      # finish what was approved (or killed)
//! OPENAI_API_KEY=sk-… cargo run --release --example ai_assistant -- \
//!     --llm-url https://api.openai.com/v1 --llm-model gpt-4o-mini --sagas 3
//! ```
//!
//! Steps: `research` (read-only: nothing to undo), `reserve_calendar_slot`
//! (compensation `cancel_slot`), `draft_email` (compensation `discard_draft`),
//! a wait for a person's `approval` (`Step::wait_for`: the saga parks, holding nothing,
//! until the signal comes; `--auto-approve` sends it at once), `send_email` (the pivot:
//! an email cannot be unsent), `create_crm_record` (after the
//! pivot, retried until it succeeds). Effects live in `assistant_research`,
//! `assistant_calendar_slots`, `assistant_drafts`, `assistant_emails` and
//! `assistant_crm_records`, one row per saga at most.
//!
//! The calendar slot and the draft answer with their id (`event_id`, `draft_id`), and
//! their undo names it: the compensation is built from the step's reply
//! (`compensate_with`) when it is dispatched. When the step's outcome is unknown (it
//! failed, timed out, or was still in flight when the saga turned back) the undo
//! carries no id and undoes whatever the saga made there, if anything.
//!
//! `research` and `draft_email` are [`CallingAgent`]s: each asks an OpenAI-compatible
//! chat-completions endpoint (`POST {base}/chat/completions`, `Authorization: Bearer
//! {key}`, the step's idempotency key as `Idempotency-Key`, the answer read from
//! `choices[0].message.content`) with no database transaction held, then records the
//! answer (the research notes, the email draft) in its table and in the saga data in
//! one short transaction. The endpoint is `--llm-url` or `OPENAI_BASE_URL` (e.g.
//! `https://api.openai.com/v1`), the key `OPENAI_API_KEY`, the model `--llm-model` or
//! `OPENAI_MODEL`. A connection error, a timeout (each request is given 3/4 of the
//! step's 20 s timeout), HTTP 5xx, 429, 408 or 409 is retryable: the step is tried
//! again with the same idempotency key, and the saga compensates once its retries run
//! out. Any other 4xx, a refusal, or a reply that is not a chat completion is fatal,
//! with the reason in the saga's error. The calendar, email and CRM agents only write
//! to the database (their undo included).
//!
//! Without an endpoint, the example starts a local stub on 127.0.0.1
//! (`examples/support/llm_stub.rs`) that answers like the real API after 200–2,000 ms,
//! rate-limits (429) or refuses with probability `--fail-rate`, seeded by `--seed`, and
//! records every request it receives in `assistant_llm_calls (idempotency_key,
//! saga_id, step, answer, at)`. The database agents fail with probability
//! `--fail-rate` too (rate limits, no free slot), whichever endpoint is used.

#[path = "support/mod.rs"]
mod support;

#[path = "support/llm_stub.rs"]
mod llm_stub;

use std::sync::Arc;
use std::time::Duration;

use agentsaga::prelude::*;
use clap::Parser;
use serde::{Deserialize, Serialize};

#[derive(Parser, Debug)]
#[command(about = "An AI assistant's request as a saga of specialised agents")]
struct Args {
    #[command(flatten)]
    common: support::CommonArgs,
    /// Base URL of an OpenAI-compatible API (requests go to {URL}/chat/completions),
    /// with its key in OPENAI_API_KEY. Without one, a local stub on 127.0.0.1 answers.
    #[arg(long, env = "OPENAI_BASE_URL")]
    llm_url: Option<String>,
    /// The model to ask.
    #[arg(long, env = "OPENAI_MODEL", default_value = "gpt-4o-mini")]
    llm_model: String,
    /// The API key (prefer the environment variable: a flag shows in `ps`).
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true, hide = true)]
    llm_api_key: Option<String>,
    /// Tests: how the local stub answers (normal, fail, hang, bad-shape, bad-request).
    #[arg(long, value_enum, default_value_t = llm_stub::Mode::Normal, hide = true)]
    llm_stub_mode: llm_stub::Mode,
    /// Tests: apply --llm-stub-mode to this step's requests only.
    #[arg(long, hide = true)]
    llm_stub_step: Option<String>,
    /// Tests: each step's timeout, in milliseconds (an LLM request gets 3/4 of it).
    #[arg(long, default_value_t = 20_000, hide = true)]
    step_timeout_ms: u64,
    /// Approve every email as soon as its saga waits for the approval. Without it the
    /// run ends once every saga is finished or waits for a person, and says how to
    /// approve one (`agentsaga sagas signal`).
    #[arg(long)]
    auto_approve: bool,
}

/// What the approver says (`--data` of `agentsaga sagas signal … approval`).
#[derive(Debug, Deserialize)]
struct Approval {
    by: String,
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
    /// Who approved the email (the `approval` signal).
    #[serde(default)]
    approved_by: Option<String>,
}

/// A command that is either done or undone by the same agent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Command {
    Do(Request),
    /// Undo what the step made: the row its reply named; `None` when its outcome is
    /// unknown.
    Undo {
        #[serde(default)]
        id: Option<String>,
    },
}

/// What an agent made: its text, and for an effect that can be undone, the id of its
/// row (what the undo names).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Made {
    text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<String>,
}

/// The compensation of a step whose reply is a [`Made`].
fn undo(_: &Request, made: Option<&Made>) -> Command {
    Command::Undo {
        id: made.and_then(|m| m.id.clone()),
    }
}

/// Where an agent records what it made (a row per saga, with a `status`), and how that
/// is undone.
#[derive(Clone, Copy)]
struct Effect {
    table: &'static str,
    /// The row's `INSERT`, once per saga: `$1` the saga, `$2` the text, and for an
    /// undoable effect `$3` its id.
    insert: &'static str,
    /// An undoable effect: the column of its id, and the status that undoes it.
    undo: Option<(&'static str, &'static str)>,
}

impl Effect {
    /// Records what was made, once per saga (a command sent again finds the saga's
    /// row), with the id of the saga's row if it has one.
    async fn record(
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
        let sql = format!("SELECT {id_column} FROM {} WHERE saga_id = $1", self.table);
        let id = support::fetch_text(ctx.conn(), &sql, &[saga]).await?;
        Ok(Made { text, id })
    }

    /// Undoes what the step made: the row its reply named, or, when its outcome is
    /// unknown, whatever row the saga has here. Nothing to undo is success.
    async fn undo(
        self,
        ctx: &mut AgentContext<'_>,
        saga: &str,
        id: Option<String>,
    ) -> Result<Made, StepError> {
        if let Some((id_column, undone)) = self.undo {
            let (column, key) = match &id {
                Some(id) => (id_column, id.as_str()),
                None => ("saga_id", saga),
            };
            let sql = format!(
                "UPDATE {} SET status = '{undone}' WHERE {column} = $1",
                self.table
            );
            support::exec(ctx.conn(), &sql, &[key]).await?;
        }
        Ok(Made {
            text: "undone".into(),
            id,
        })
    }
}

fn saga_of(ctx: &CallContext<'_>) -> Result<String, StepError> {
    ctx.saga_id()
        .map(|s| s.to_string())
        .ok_or_else(|| StepError::fatal("no saga id"))
}

// ---------------------------------------------------------------------------------
// The LLM client.

/// An OpenAI-compatible chat-completions client.
struct Llm {
    http: reqwest::Client,
    endpoint: String,
    api_key: Option<String>,
    model: String,
    timeout: Duration,
}

#[derive(Deserialize)]
struct Completion {
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    message: AssistantMessage,
}

#[derive(Deserialize)]
struct AssistantMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
}

/// At most `n` characters of `s`, for error messages.
fn clip(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// An error with its sources: reqwest's own message says little ("error sending
/// request"), the cause is further down.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

impl Llm {
    fn new(
        base: &str,
        api_key: Option<String>,
        model: String,
        timeout: Duration,
        local: bool,
    ) -> anyhow::Result<Self> {
        let mut http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)));
        if local {
            http = http.no_proxy();
        }
        Ok(Self {
            http: http.build()?,
            endpoint: format!("{}/chat/completions", base.trim_end_matches('/')),
            api_key,
            model,
            timeout,
        })
    }

    /// Asks the model; the answer's text, or what the failure means for the step.
    async fn chat(
        &self,
        ctx: &CallContext<'_>,
        system: &str,
        user: &str,
    ) -> Result<String, StepError> {
        let body = serde_json::json!({
            "model": self.model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
        });
        let mut request = self
            .http
            .post(&self.endpoint)
            .header("Idempotency-Key", ctx.idempotency_key())
            .header(llm_stub::SAGA_HEADER, saga_of(ctx)?)
            .header(llm_stub::STEP_HEADER, ctx.step_name().unwrap_or_default())
            .json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| {
            StepError::retryable(if e.is_timeout() {
                format!(
                    "LLM request to {} timed out after {:?}",
                    self.endpoint, self.timeout
                )
            } else {
                format!("LLM endpoint {} unreachable: {}", self.endpoint, chain(&e))
            })
        })?;
        let status = response.status();
        let text = response.text().await.map_err(|e| {
            StepError::retryable(format!(
                "LLM reply from {} cut short ({status}): {}",
                self.endpoint,
                chain(&e)
            ))
        })?;
        read_reply(&self.endpoint, status.as_u16(), &text)
    }
}

/// What an endpoint's answer means: the model's text, or the step's error.
fn read_reply(endpoint: &str, status: u16, body: &str) -> Result<String, StepError> {
    if !(200..300).contains(&status) {
        // The API's error object, or whatever the body says.
        let detail = serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| clip(body.trim(), 200));
        let reason = format!("LLM endpoint {endpoint} answered HTTP {status}: {detail}");
        // Overloaded, rate-limited, timed out, or a request with this idempotency key
        // still in progress: worth another try. Anything else the caller got wrong.
        return Err(match status {
            408 | 409 | 429 | 500..=599 => StepError::retryable(reason),
            _ => StepError::fatal(reason),
        });
    }
    let completion: Completion = serde_json::from_str(body).map_err(|e| {
        StepError::fatal(format!(
            "LLM reply from {endpoint} is not a chat completion ({e}): {}",
            clip(body.trim(), 200)
        ))
    })?;
    let Some(choice) = completion.choices.into_iter().next() else {
        return Err(StepError::fatal(format!(
            "LLM reply from {endpoint} has no choices"
        )));
    };
    if let Some(refusal) = choice.message.refusal {
        return Err(StepError::fatal(format!("the model refused: {refusal}")));
    }
    match choice.message.content {
        Some(text) if !text.trim().is_empty() => Ok(text),
        _ => Err(StepError::fatal(format!(
            "LLM reply from {endpoint} has no content in choices[0].message"
        ))),
    }
}

// ---------------------------------------------------------------------------------
// The agents that ask the LLM.

#[derive(Clone, Copy)]
enum Writing {
    Research,
    Draft,
}

impl Writing {
    fn destination(self) -> &'static str {
        match self {
            Writing::Research => "research",
            Writing::Draft => "drafts",
        }
    }

    /// (system prompt, user prompt)
    fn prompt(self, req: &Request) -> (&'static str, String) {
        match self {
            Writing::Research => (
                "You are the research agent of an executive assistant. Answer in at most \
                 three sentences of plain text.",
                format!(
                    "Research the company \"{}\": what does it do, and what recent fact is \
                     worth mentioning when writing to them?",
                    req.company
                ),
            ),
            Writing::Draft => (
                "You are the email-writing agent of an executive assistant. Write the body \
                 of a short, friendly email in plain text, without a subject line.",
                format!(
                    "Write to {} proposing a meeting on {}. What we know about them: {}",
                    req.company,
                    req.slot.as_deref().unwrap_or("a day that suits them"),
                    req.findings.as_deref().unwrap_or("nothing yet")
                ),
            ),
        }
    }

    fn effect(self) -> Effect {
        match self {
            Writing::Research => Effect {
                table: "assistant_research",
                insert: "INSERT INTO assistant_research (saga_id, status, summary) VALUES ($1, 'done', $2) ON CONFLICT (saga_id) DO NOTHING",
                undo: None,
            },
            Writing::Draft => Effect {
                table: "assistant_drafts",
                insert: "INSERT INTO assistant_drafts (saga_id, status, body, draft_id) VALUES ($1, 'drafted', $2, $3) ON CONFLICT (saga_id) DO NOTHING",
                undo: Some(("draft_id", "discarded")),
            },
        }
    }
}

struct LlmAgent {
    writing: Writing,
    llm: Arc<Llm>,
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
            Command::Do(req) => {
                let (system, user) = self.writing.prompt(req);
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
enum Skill {
    Calendar,
    Email,
    Crm,
}

impl Skill {
    fn destination(self) -> &'static str {
        match self {
            Skill::Calendar => "calendar",
            Skill::Email => "email",
            Skill::Crm => "crm",
        }
    }

    fn effect(self) -> Effect {
        match self {
            Skill::Calendar => Effect {
                table: "assistant_calendar_slots",
                insert: "INSERT INTO assistant_calendar_slots (saga_id, status, slot, event_id) VALUES ($1, 'reserved', $2, $3) ON CONFLICT (saga_id) DO NOTHING",
                undo: Some(("event_id", "cancelled")),
            },
            Skill::Email => Effect {
                table: "assistant_emails",
                insert: "INSERT INTO assistant_emails (saga_id, status, body) VALUES ($1, 'sent', $2) ON CONFLICT (saga_id) DO NOTHING",
                undo: None,
            },
            Skill::Crm => Effect {
                table: "assistant_crm_records",
                insert: "INSERT INTO assistant_crm_records (saga_id, status, note) VALUES ($1, 'created', $2) ON CONFLICT (saga_id) DO NOTHING",
                undo: None,
            },
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
    type Reply = Made;

    fn destination(&self) -> &str {
        self.skill.destination()
    }

    async fn handle(&self, ctx: &mut AgentContext<'_>, cmd: Command) -> Result<Made, StepError> {
        let saga = saga_of(ctx)?;
        let effect = self.skill.effect();
        let req = match cmd {
            Command::Undo { id } => return effect.undo(ctx, &saga, id).await,
            Command::Do(req) => req,
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
                    req.company
                )));
            }
            _ => {}
        }
        let produced = match self.skill {
            Skill::Calendar => format!("{} Tue 10:00", req.company),
            Skill::Email => req.draft.clone().unwrap_or_default(),
            Skill::Crm => format!("contacted {}", req.company),
        };
        effect.record(ctx, &saga, produced).await
    }
}

const DDL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS assistant_research (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status = 'done'), summary TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS assistant_calendar_slots (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status IN ('reserved', 'cancelled')), slot TEXT NOT NULL, event_id TEXT NOT NULL UNIQUE)",
    "CREATE TABLE IF NOT EXISTS assistant_drafts (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status IN ('drafted', 'discarded')), body TEXT NOT NULL, draft_id TEXT NOT NULL UNIQUE)",
    "CREATE TABLE IF NOT EXISTS assistant_emails (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status = 'sent'), body TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS assistant_crm_records (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status = 'created'), note TEXT NOT NULL)",
    llm_stub::CALLS_DDL,
];

fn definition(timeout: Duration) -> anyhow::Result<agentsaga::saga::SagaDefinition> {
    let retry = RetryPolicy::new(Duration::from_millis(50), Duration::from_secs(1), 5);
    let step = |name: &str, destination: &str| {
        Step::<Request>::new(name, destination)
            .command(|r: &Request| Command::Do(r.clone()))
            .retry(retry)
            .timeout(timeout)
    };
    Ok(Saga::<Request>::builder("ai_assistant", 1)
        .step(
            step("research", Writing::Research.destination())
                .on_reply(|r: &mut Request, findings: Made| r.findings = Some(findings.text))
                .nothing_to_undo(),
        )
        // Each undo names the row its step's reply gave (`cancel_slot`, `discard_draft`).
        .step(
            step("reserve_calendar_slot", Skill::Calendar.destination())
                .on_reply(|r: &mut Request, slot: Made| r.slot = Some(slot.text))
                .compensate_with(Skill::Calendar.destination(), undo),
        )
        .step(
            step("draft_email", Writing::Draft.destination())
                .on_reply(|r: &mut Request, draft: Made| r.draft = Some(draft.text))
                .compensate_with(Writing::Draft.destination(), undo),
        )
        // A person approves the email before it goes (`--auto-approve`, or
        // `agentsaga sagas signal ID approval --data '{"by":"you"}'`).
        .step(
            Step::wait_for("approval")
                .on_reply(|r: &mut Request, a: Approval| r.approved_by = Some(a.by)),
        )
        .pivot(step("send_email", Skill::Email.destination()))
        .step(step("create_crm_record", Skill::Crm.destination()))
        .build()?)
}

/// `--auto-approve`: approves each saga that waits for its approval, as a person would.
async fn auto_approve(store: Store) {
    use agentsaga::saga::query::{self, ListFilter};
    use agentsaga::saga::{Engine, Signal};
    loop {
        let waiting = query::list(
            &store,
            &ListFilter {
                waiting: true,
                limit: 1000,
                ..ListFilter::default()
            },
        )
        .await;
        for saga in waiting.unwrap_or_default() {
            let approve = async {
                let mut tx = store.begin().await?;
                let signal = Signal::Approve(serde_json::json!({ "by": "auto-approve" }));
                Engine::signal(&mut tx, saga.id, "approval", signal).await?;
                tx.commit().await?;
                anyhow::Ok(())
            };
            if let Err(e) = approve.await {
                tracing::warn!(saga.id = %saga.id, error = %e, "auto-approve failed; trying again");
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let telemetry = support::init_telemetry("ai_assistant")?;
    let common = &args.common;
    common.validate()?;
    if args.step_timeout_ms < 100 {
        anyhow::bail!("--step-timeout-ms must be at least 100");
    }
    let step_timeout = Duration::from_millis(args.step_timeout_ms);
    let url = common.url("ai_assistant.db");
    let (seed, fail_rate) = (common.seed, common.fail_rate);

    // The tables exist before anything runs: sagas left by a killed run resume (and
    // call the LLM) as soon as the runtime starts.
    let store = Store::connect(&url).await?;
    support::create_tables(&store, DDL).await?;

    let endpoint = args.llm_url.clone().filter(|u| !u.trim().is_empty());
    let (stub, base, api_key) = match endpoint {
        Some(base) => (None, base, args.llm_api_key.clone()),
        None => {
            let stub = llm_stub::start(llm_stub::Config {
                seed,
                fail_rate,
                mode: args.llm_stub_mode,
                only_step: args.llm_stub_step.clone(),
                store: Some(store.clone()),
            })
            .await?;
            let base = stub.base_url.clone();
            (Some(stub), base, Some(llm_stub::API_KEY.to_owned()))
        }
    };
    if !common.quiet {
        let whose = if stub.is_some() { " (local stub)" } else { "" };
        eprintln!("LLM: {} at {base}{whose}", args.llm_model);
    }
    let llm = Arc::new(Llm::new(
        &base,
        api_key,
        args.llm_model.clone(),
        step_timeout * 3 / 4,
        stub.is_some(),
    )?);

    let mut builder = Runtime::builder()
        .store(store)
        .saga(definition(step_timeout)?);
    for writing in [Writing::Research, Writing::Draft] {
        builder = builder.calling_agent(LlmAgent {
            writing,
            llm: Arc::clone(&llm),
        });
    }
    for skill in [Skill::Calendar, Skill::Email, Skill::Crm] {
        builder = builder.agent(SkillAgent {
            skill,
            seed,
            fail_rate,
        });
    }
    let runtime = support::configure(builder, common).start().await?;
    let approver = args
        .auto_approve
        .then(|| tokio::spawn(auto_approve(runtime.store().clone())));
    let companies = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Stark"];
    // Request `i` is started with the key `request-<i>`: a rerun of the same requests
    // starts nothing new. Without `--auto-approve` the run ends when every saga is
    // finished or waits for a person.
    let mut saga = support::Saga::named("ai_assistant").keyed(|i| format!("request-{i}"));
    if !args.auto_approve {
        saga = saga.waits_for_signals();
    }
    support::run(runtime, common, &url, DDL, saga, |i| Request {
        company: format!("{} #{i}", companies[(i % 6) as usize]),
        findings: None,
        slot: None,
        draft: None,
        approved_by: None,
    })
    .await?;
    if let Some(approver) = approver {
        approver.abort();
    }
    drop(stub);
    telemetry.shutdown().await;
    Ok(())
}
