//! AI assistant: "research company X, draft an email, schedule a meeting" as a saga
//! whose steps a planner agent (an LLM call) chooses at run time, carried out by
//! specialised agents.
//!
//! ```sh
//! cargo run --release --example ai_assistant -- --sagas 50 --fail-rate 0.2 --seed 1 --auto-approve
//! cargo run --release --example ai_assistant -- --sagas 10 --auto-approve --follow-up-after 5s --reply-rate 0.5
//! cargo run --release --example ai_assistant -- --sagas 5     # ends with 5 waiting for approval
//! cargo run -p agentsaga-cli -- --database-url sqlite://ai_assistant.db sagas signal ID approval --data '{"by":"you"}'
//! cargo run --release --example ai_assistant -- --sagas 0      # finish what was approved (or killed)
//! OPENAI_API_KEY=sk-… cargo run --release --example ai_assistant -- \
//!     --llm-url https://api.openai.com/v1 --llm-model gpt-4o-mini --sagas 3
//! ```
//!
//! The saga (`PlannedSaga`, `ai_assistant` version 4) has one step of its own, the
//! planner's, which re-plans (`replan(3)`): the planner agent asks the LLM for the
//! first stages, the saga runs them, and the planner is asked again with the results
//! so far, in up to three turns. Turn 1 (step `plan`) plans the research (`research`,
//! sometimes in parallel with `reserve_calendar_slot` or with three child sagas);
//! turn 2 (`plan_2`), having read the research's results, plans the rest: sometimes
//! `reserve_calendar_slot`, `draft_email` (its `$from` points at turn 1's results), a
//! wait for a person's `approval`, `send_email` (the pivot), `create_crm_record`
//! (after the pivot, retried until it succeeds), then the follow-up: `await_reply`, a
//! wait for the company's `reply` that ends after `--follow-up-after` without one
//! (`{"wait_for": "reply", "or_after": "2s"}`), and `follow_up`, whose command takes
//! `{"$from": "/results/await_reply"}`: the reply's data, or `null` when the wait
//! ended by time (its fold, which stores the data, is not called then); turn 3
//! (`plan_3`) answers `{"done": true}`. The system prompt describes the plan format
//! (stages of steps, parallel groups, each step's undo or `nothing_to_undo`, the
//! pivot, waits for a signal, a wait that ends by time, `$from` references), the
//! turns, and the agents a plan may use, with their commands: `research` (read-only),
//! `calendar` (reserves a meeting slot; undo names the slot), `drafts` (writes the
//! email; undo names the draft), `email` (sends it: it cannot be unsent), `crm`
//! (records the contact) and `follow_ups` (drafts a follow-up when no reply came, else
//! notes the reply); the request says how long to wait. Each turn is a step of its own
//! (its own idempotency key, its answer stored): a restart never asks a turn twice,
//! and a saga that turns back undoes the steps of every turn, latest first.
//!
//! The planner may delegate: a plan's stage may be a child saga, `{"name":
//! "competitor_1", "saga": "competitor_research", "input": {"company": "<a
//! competitor>"}}`, the one child saga the assistant allows (`child_sagas`). Each is a
//! `PlannedSaga` of its own (`competitor_research` version 1): its planner (at
//! `research_planner`) asks the LLM for its plan, which may only send to `research`
//! and must have a step named `research`; its data, once completed, is the step's
//! result, and the draft takes its notes as `competitors` (`{"$from":
//! "/results/competitor_1/results/research/text"}`). A typical delegating plan: the
//! research in a parallel group with three such children, then the draft. The
//! children have no pivot, so the plan gives them no undo: a parent that turns back
//! compensates each child as a whole (a child that completed is compensated too), and
//! a child that fails fails its step. The assistant allows at most three children per
//! plan and gives each child stage three step timeouts (its deadline, which bounds
//! the whole child).
//!
//! The plan is data, never code. The model's answer (prose around a fenced JSON block,
//! or bare JSON) is read with `Plan::from_text` and refused, with the reason, unless it
//! passes, with the turns before it as one plan, the engine's rules
//! (`SagaDefinition::check_plan`: an undo for every step before the pivot, known
//! destinations, names unique across turns, `$from` pointing into the input or an
//! earlier step's result) and the assistant's own: exactly one email, sent by the
//! pivot, after a wait for `approval` (a plan may lack its email until the last turn
//! or `done`); a wait for `reply` only after the email, a follow-up only after such a
//! wait. The assistant sets each step's timeout and attempts itself, and each wait for
//! `reply`'s `or_after` (`--follow-up-after`), whatever the model wrote. A refused
//! plan fails the planner's step fatally: the saga compensates and its error reads
//! `the planner's invalid plan: <reason>` (once the plan so far has sent its email, a
//! refused or invalid turn ends the planning instead: the saga cannot turn back). An
//! accepted turn is recorded in `assistant_plans` (the plan of every turn so far, with
//! the model's answers) and stored with the saga, so a process restarted after `kill
//! -9` resumes it without asking the model again.
//!
//! The saga data is `{"input": {"company": …}, "plan": …, "turns": [<stages added by
//! each turn>, …], "results": {"<step>": <its reply>, …}}`, and the plan's commands take what they need from it with `$from`
//! references, resolved when a command is sent: the draft gets
//! `{"$from": "/results/research/text"}`. The calendar slot and the draft reply with
//! their id, and their undo names it (`{"op": "undo", "id": {"$from":
//! "/results/reserve_calendar_slot/id"}}`), built when the compensation is dispatched.
//! When the step's outcome is unknown (it failed, timed out, or was still in flight
//! when the saga turned back) the reference gives `null`, and the undo undoes whatever
//! the saga made there, if anything. Effects live in `assistant_research`,
//! `assistant_calendar_slots`, `assistant_drafts`, `assistant_emails`,
//! `assistant_crm_records` and `assistant_follow_ups` (`drafted`, or `replied`: no
//! follow-up), one row per saga at most (a child saga's plan and research notes have
//! rows of their own, under the child's id).
//!
//! The wait for `approval` parks the saga, holding nothing, until the signal comes:
//! `--auto-approve` sends it at once; without it the run ends once every saga is
//! finished or waits, says how many wait, and prints the `agentsaga sagas signal`
//! command that approves one; a later run with `--sagas 0` finishes the approved ones.
//! Request `i` is started with the key `request-<i>`, so a rerun of the same requests
//! starts nothing new. The wait for `reply` parks the saga too, with its wake-up due
//! at its time (a message in the outbox: it survives a restart), but no person is
//! needed: a run waits for it to end, by the reply or by time (keep
//! `--follow-up-after` short, 2 s by default, for quick runs; a run stopped before
//! then leaves the rest to a later `--sagas 0`). Replies come from a simulated inbox
//! (`--reply-rate`, 0.3 by default): a saga waiting for its reply gets one with that
//! probability, decided by the seed and the request, in the first half of its wait,
//! sent as an agent's signal (`Engine::signal_by` with `SignalSender::Agent`), which the
//! saga takes for `reply` (`agent_signals`) and would refuse for `approval`. A saga
//! that gets a reply records it (`replied`), one that does not drafts the follow-up.
//!
//! `plan` (both sagas'), `research` and `draft_email` are [`CallingAgent`]s: each asks an
//! OpenAI-compatible chat-completions endpoint (`POST {base}/chat/completions`,
//! `Authorization: Bearer {key}`, the step's idempotency key as `Idempotency-Key`, the
//! answer read from `choices[0].message.content`) with no database transaction held,
//! then records the answer (the plan, the research notes, the email draft) in its table
//! and in the saga data in one short transaction. The endpoint is `--llm-url` or
//! `OPENAI_BASE_URL` (e.g. `https://api.openai.com/v1`), the key `OPENAI_API_KEY`, the
//! model `--llm-model` or `OPENAI_MODEL`. A connection error, a timeout (each request is
//! given 3/4 of the step's 20 s timeout), HTTP 5xx, 408 or 409 is retryable: the
//! step is tried again with the same idempotency key, and the saga compensates once its
//! retries run out. A 429 spends no retry: the four LLM destinations share the
//! account's `--llm-rpm` (a quarter each, `RateLimit`, in every process), and a 429's
//! `Retry-After` pauses its destination. Each reply's `usage` counts against the
//! request's budget, `--budget-tokens-out` tokens out: once spent, it compensates. Any other 4xx, a refusal, or a reply that is not a chat completion
//! is fatal, with the reason in the saga's error. The calendar, email and CRM agents
//! only write to the database (their undo included).
//!
//! Without an endpoint, the example starts a local stub on 127.0.0.1
//! (`examples/support/llm_stub.rs`) that answers like the real API after 200–2,000 ms
//! (the planner with a plan in a fenced block amid prose, turn by turn, varying from
//! saga to saga: a quarter of them delegate to three children; `{"done": true}` in
//! its third turn), rate-limits (429) or refuses with probability `--fail-rate`, seeded by
//! `--seed`, enforces `--llm-rpm` (429 past it), and records every request it receives in `assistant_llm_calls
//! (idempotency_key, saga_id, step, answer, at)`. The database agents fail with
//! probability `--fail-rate` too (rate limits, no free slot), whichever endpoint is
//! used.

#[path = "../support/mod.rs"]
mod support;

#[path = "../support/llm_stub.rs"]
mod llm_stub;

mod agents;
mod data;
mod llm;
mod planner;
mod rules;
mod setup;
mod signals;

use agents::*;
use data::*;
use llm::*;
use planner::*;
use rules::*;
use setup::*;

use std::sync::Arc;
use std::time::Duration;

use agentsaga::prelude::*;
use agentsaga::runtime::RuntimeBuilder;
use agentsaga::saga::{PlanStage, SagaDefinition};
use clap::Parser;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Parser, Debug)]
#[command(about = "An AI assistant's request as a saga whose steps an LLM planner chooses")]
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
    /// Tests: how the local stub answers (normal, fail, hang, bad-shape, bad-request;
    /// bad-plan and no-plan for the planner's requests).
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
    /// The LLM account's rate limit, requests a minute, shared by its four
    /// destinations (a quarter each, in every process); the local stub enforces it.
    #[arg(long, default_value_t = 12_000)]
    llm_rpm: u32,
    /// Tests: the stub's own limit, if not --llm-rpm.
    #[arg(long, hide = true)]
    llm_stub_rpm: Option<u32>,
    /// Each request's budget of tokens out; once spent it compensates (0: no budget).
    #[arg(long, default_value_t = 20_000)]
    budget_tokens_out: u64,
    /// How long a saga waits for the company's reply once its email is sent before it
    /// drafts a follow-up ("2s", "3d", "2h 30m", ISO 8601 "PT5M"). The run waits for it.
    #[arg(long, default_value = "2s")]
    follow_up_after: String,
    /// The probability that a company replies before the follow-up is due (the
    /// simulated inbox's `reply` signal), 0.0–1.0.
    #[arg(long, default_value_t = 0.3)]
    reply_rate: f64,
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
    if !(0.0..=1.0).contains(&args.reply_rate) {
        anyhow::bail!("--reply-rate must be between 0 and 1");
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
                requests_per_minute: Some(args.llm_stub_rpm.unwrap_or(args.llm_rpm)),
                follow_up_after: Some(args.follow_up_after.clone()),
                instant: false,
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

    let settings = Settings {
        step_timeout,
        budget_tokens_out: args.budget_tokens_out,
        follow_up_after: args.follow_up_after.clone(),
        llm_rpm: args.llm_rpm,
        seed,
        fail_rate,
    };
    let builder = assistant(Runtime::builder().store(store), &llm, &settings)?;
    let runtime = support::configure(builder, common).start().await?;
    let store = runtime.store().clone();
    let approver = args
        .auto_approve
        .then(|| tokio::spawn(signals::auto_approve(store.clone())));
    let inbox = tokio::spawn(signals::inbox(store, seed, args.reply_rate));
    let companies = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Stark"];
    // Request `i` is started with the key `request-<i>`: a rerun of the same requests
    // starts nothing new. Without `--auto-approve` the run ends when every saga is
    // finished or waits for a person; a saga waiting for a reply is waited for (its
    // wait ends by time).
    let mut saga = support::Saga::named("ai_assistant").keyed(|i| format!("request-{i}"));
    if !args.auto_approve {
        saga = saga.waits_for_signals(&[APPROVAL]);
    }
    support::run(runtime, common, &url, DDL, saga, |i| Input {
        company: format!("{} #{i}", companies[(i % 6) as usize]),
    })
    .await?;
    if let Some(approver) = approver {
        approver.abort();
    }
    inbox.abort();
    drop(stub);
    telemetry.shutdown().await;
    Ok(())
}
