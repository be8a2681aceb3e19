//! A local stand-in for an OpenAI-compatible chat-completions endpoint, for the
//! ai_assistant example (when it is given no `--llm-url`) and its tests.
//!
//! It serves `POST {base}/chat/completions` on 127.0.0.1 (a free port), with `base`
//! ending in `/v1` like the real API's, and answers like the real API: a
//! `chat.completion` object whose `choices[0].message.content` is the answer, after a
//! delay of 200–2,000 ms; errors are `{"error": {"message", "type", "code"}}` with
//! the real API's status codes. It checks `Authorization: Bearer {API_KEY}`, and
//! requires an `Idempotency-Key` header and a JSON body with `model` and `messages`.
//!
//! Everything it decides is a hash of the seed, the request's idempotency key and how
//! many requests with that key it has seen: a run is reproducible.
//! - In [`Mode::Normal`], a request is rate-limited (429) with probability
//!   `0.6 × fail_rate`, and refused by the model (a 200 whose message carries a
//!   `refusal` and no content) with probability `0.4 × fail_rate`.
//! - The planner's requests (their system prompt starts with [`PLANNER_ROLE`]) are
//!   answered, like a chat model would, with a plan for the example's agents: a few
//!   words, the plan as JSON in a ```` ```json ```` block, a closing remark. It plans
//!   in turns (the turn read from the step, [`STEP_HEADER`]: `plan`, `plan_2`,
//!   `plan_3`): the research first, the rest (from the draft on) second, then
//!   `{"done": true}`. Given [`Config::follow_up_after`], the rest ends, after the CRM
//!   record, with `await_reply` (a wait for `reply` that ends after that long) and
//!   `follow_up` (to `follow_ups`, with the reply, `null` if none came). The plan
//!   depends on the seed and the request's company alone (the same for a
//!   retried request, and in each turn): a quarter of them reserve no calendar slot, a
//!   quarter research and reserve the slot in parallel, a quarter reserve it after
//!   the research (second turn), and the rest delegate: the research runs in a
//!   parallel group with three child `competitor_research` sagas (`competitor_1..3`,
//!   for "<company> rival 1..3", the company read from the request), whose notes the
//!   draft takes as `competitors`.
//!   A competitor's research's planner (its system prompt starts with
//!   [`RESEARCH_PLANNER_ROLE`]) gets a one-step plan: `research`.
//! - The other modes are for tests (hidden flag `--llm-stub-mode`), applied to every
//!   request or, given [`Config::only_step`] (`--llm-stub-step`), to those of one saga
//!   step: [`Mode::Fail`] answers 503 at once, [`Mode::Hang`] never answers,
//!   [`Mode::BadShape`] answers 200 with JSON that is not a chat completion,
//!   [`Mode::BadRequest`] answers 400. [`Mode::BadPlan`] and [`Mode::NoPlan`] change
//!   the planners' answers only (the others are normal, without injected failures for
//!   the planner): a plan with a step for an agent the example does not have, or
//!   prose with no plan in it.
//!
//! - Given [`Config::requests_per_minute`], it enforces an account's rate limit of its
//!   own, before anything else: past it, 429 with the `Retry-After` it would accept.
//!
//! Each request is recorded, before it is answered, as a row of
//! `assistant_llm_calls (idempotency_key, saga_id, step, answer, at)` ([`CALLS_DDL`]):
//! the saga and step come from the [`SAGA_HEADER`] and [`STEP_HEADER`] request
//! headers, which the example's client sends beside the key so that tests can check
//! that a key belongs to one saga step; `answer` is the status it answered (`200`,
//! `200 refusal`, `200 bad-shape`, `200 bad-plan`, `200 no-plan`, `429`, `429 limit`,
//! `503`, `400`,
//! `hang`).

#![allow(unreachable_pub)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga::core::{Sql, Store};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

#[path = "llm_stub_answers.rs"]
mod answers;

use answers::{Answer, Content, NO_PLAN, Pace, Planner, compose, plan, research_plan, turn_of};

/// The bearer token the stub accepts.
pub const API_KEY: &str = "agentsaga-local-stub";
/// The header naming the saga a request works for (sent by the example's client).
pub const SAGA_HEADER: &str = "x-agentsaga-saga-id";
/// The header naming the saga step a request works for (sent by the example's client).
pub const STEP_HEADER: &str = "x-agentsaga-step";
/// How the system prompt of a planner's request starts: the stub answers those with a
/// plan.
pub const PLANNER_ROLE: &str = "You are the planning agent of an executive assistant.";
/// How the system prompt of a competitor's research planner's request starts: the stub
/// answers those with a research plan.
pub const RESEARCH_PLANNER_ROLE: &str = "You are the planning agent of a research team.";
/// The table of the requests the stub received (portable DDL).
pub const CALLS_DDL: &str = "CREATE TABLE IF NOT EXISTS assistant_llm_calls (idempotency_key TEXT NOT NULL, saga_id TEXT NOT NULL, step TEXT NOT NULL, answer TEXT NOT NULL, at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)";
const CALLS_INSERT: &str =
    "INSERT INTO assistant_llm_calls (idempotency_key, saga_id, step, answer) VALUES (?, ?, ?, ?)";

/// How the stub answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Mode {
    /// Like the real API, with the seeded rate limits and refusals of `fail_rate`.
    #[default]
    Normal,
    /// 503 Service Unavailable, at once.
    Fail,
    /// Never answers.
    Hang,
    /// 200 with a JSON body that is not a chat completion.
    BadShape,
    /// 400 Bad Request.
    BadRequest,
    /// The planner gets a plan with a step for an agent the example lacks (`slack`).
    BadPlan,
    /// The planner gets prose with no plan in it.
    NoPlan,
}

/// What the stub is started with.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Seed of every decision (delays, injected failures).
    pub seed: u64,
    /// Probability that a request fails in [`Mode::Normal`] (429 or a refusal).
    pub fail_rate: f64,
    /// How it answers.
    pub mode: Mode,
    /// Applies `mode` only to the requests of this saga step (by [`STEP_HEADER`]);
    /// the others are answered as in [`Mode::Normal`].
    pub only_step: Option<String>,
    /// Where to record each request (`assistant_llm_calls`, created if missing).
    pub store: Option<Store>,
    /// The account's rate limit, requests a minute (with a burst of a second's worth):
    /// a request past it is answered 429 with the `Retry-After` (and `retry-after-ms`)
    /// it would be taken after, recorded as `429 limit`. `None`: no limit.
    pub requests_per_minute: Option<u32>,
    /// How long the assistant's plans wait for a reply to the email before the
    /// follow-up (`"2s"`, `"3d"`); `None`: no wait, no follow-up.
    pub follow_up_after: Option<String>,
    /// Answer at once, without the real API's 200–2,000 ms (tests on a manual clock).
    pub instant: bool,
}

/// A running stub; stops when dropped.
pub struct Stub {
    /// The API's base URL, e.g. `http://127.0.0.1:40123/v1`.
    pub base_url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Shared {
    config: Config,
    /// Requests seen per idempotency key.
    seen: Mutex<HashMap<String, u64>>,
    /// The account's pace, if it has a rate limit.
    pace: Mutex<Pace>,
}

/// Starts the stub on 127.0.0.1, on a free port.
///
/// # Errors
/// Creating the calls table, or binding the port.
pub async fn start(config: Config) -> anyhow::Result<Stub> {
    if let Some(store) = &config.store {
        exec(store, CALLS_DDL, &[]).await?;
    }
    let shared = Arc::new(Shared {
        config,
        seen: Mutex::new(HashMap::new()),
        pace: Mutex::new(Pace::default()),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .with_state(shared);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the LLM stub stopped");
        }
    });
    Ok(Stub {
        base_url: format!("http://{addr}/v1"),
        task,
    })
}

/// A number in [0, 1) decided by the seed, the request and `salt`.
fn unit(seed: u64, key: &str, nth: u64, salt: &str) -> f64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    (seed, key, nth, salt).hash(&mut h);
    fastrand::Rng::with_seed(h.finish()).f64()
}

fn error(status: StatusCode, kind: &str, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({
            "error": {"message": message, "type": kind, "param": null, "code": code}
        })),
    )
        .into_response()
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let config = &shared.config;
    let bearer = header_str(&headers, header::AUTHORIZATION.as_str())
        .and_then(|h| h.strip_prefix("Bearer "));
    if bearer != Some(API_KEY) {
        return error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            "Incorrect API key provided.",
        );
    }
    let Some(key) = header_str(&headers, "idempotency-key").map(str::to_owned) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "missing_idempotency_key",
            "This endpoint requires an Idempotency-Key header.",
        );
    };
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_json",
                &format!("We could not parse the JSON body of your request: {e}"),
            );
        }
    };
    let model = request["model"].as_str().unwrap_or_default().to_owned();
    let Some(messages) = request["messages"].as_array().filter(|m| !m.is_empty()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_request",
            "'messages' must be a non-empty array.",
        );
    };
    if model.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_request",
            "you must provide a model parameter.",
        );
    }
    let prompt = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    let planner = Planner::of(messages);
    let saga = header_str(&headers, SAGA_HEADER).unwrap_or_default();
    let step = header_str(&headers, STEP_HEADER).unwrap_or_default();
    let turn = turn_of(step);
    let follow_up = config.follow_up_after.as_deref();

    let nth = {
        let mut seen = shared.seen.lock().expect("not poisoned");
        let n = seen.entry(key.clone()).or_default();
        *n += 1;
        *n
    };
    let targeted = config.only_step.as_deref().is_none_or(|s| s == step);
    let mode = if targeted { config.mode } else { Mode::Normal };
    let delay = if config.instant {
        Duration::ZERO
    } else {
        Duration::from_millis(200 + (unit(config.seed, &key, nth, "delay") * 1800.0) as u64)
    };
    let over = config.requests_per_minute.and_then(|rpm| {
        let mut pace = shared.pace.lock().expect("not poisoned");
        pace.take(rpm).err()
    });
    let answer = match mode {
        _ if over.is_some() => Answer::OverLimit(over.unwrap_or_default()),
        Mode::Fail => Answer::Unavailable,
        Mode::Hang => Answer::Hang,
        Mode::BadShape => Answer::BadShape,
        Mode::BadRequest => Answer::BadRequest,
        Mode::BadPlan if planner.is_some() => Answer::Completion {
            content: Content::BadPlan,
            delay,
        },
        Mode::NoPlan if planner.is_some() => Answer::Completion {
            content: Content::NoPlan,
            delay,
        },
        Mode::Normal | Mode::BadPlan | Mode::NoPlan => {
            let r = unit(config.seed, &key, nth, "fail");
            if r < config.fail_rate * 0.6 {
                Answer::RateLimited
            } else if r < config.fail_rate {
                Answer::Completion {
                    content: Content::Refusal,
                    delay,
                }
            } else {
                Answer::Completion {
                    content: Content::Answer,
                    delay,
                }
            }
        }
    };
    if let Some(store) = &config.store
        && let Err(e) = exec(store, CALLS_INSERT, &[&key, saga, step, answer.label()]).await
    {
        tracing::warn!(error = %e, "the LLM stub could not record a call");
    }

    match answer {
        Answer::Hang => std::future::pending::<Response>().await,
        Answer::Unavailable => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "service_unavailable",
            "The server is overloaded or not ready yet.",
        ),
        Answer::RateLimited => {
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "requests",
                "rate_limit_exceeded",
                "Rate limit reached for requests. Please try again in 1s.",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            r
        }
        Answer::OverLimit(wait) => {
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "requests",
                "rate_limit_exceeded",
                &format!("Rate limit reached for requests. Please try again in {wait:?}."),
            );
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            for (name, value) in [
                ("retry-after", secs.to_string()),
                ("retry-after-ms", wait.as_millis().max(1).to_string()),
            ] {
                if let Ok(v) = header::HeaderValue::from_str(&value) {
                    r.headers_mut().insert(name, v);
                }
            }
            r
        }
        Answer::BadRequest => error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "context_length_exceeded",
            "This model's maximum context length was exceeded.",
        ),
        Answer::BadShape => axum::Json(json!({
            "object": "list",
            "data": [{"id": model, "object": "model"}]
        }))
        .into_response(),
        Answer::Completion { content, delay } => {
            tokio::time::sleep(delay).await;
            let text = match content {
                Content::Refusal => None,
                Content::Answer => Some(match planner {
                    Some(Planner::Assistant) => {
                        plan(config.seed, saga, (turn, follow_up), &prompt, false)
                    }
                    Some(Planner::Research) => research_plan(),
                    None => compose(config.seed, &key, &prompt),
                }),
                Content::BadPlan => Some(plan(config.seed, saga, (turn, follow_up), &prompt, true)),
                Content::NoPlan => Some(NO_PLAN.to_owned()),
            };
            let message = match text {
                None => json!({"role": "assistant", "content": null,
                               "refusal": "I'm sorry, I can't help with that request."}),
                Some(text) => json!({"role": "assistant", "content": text, "refusal": null}),
            };
            let created = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let prompt_tokens = prompt.split_whitespace().count();
            let completion_tokens = message["content"]
                .as_str()
                .map_or(0, |c| c.split_whitespace().count());
            axum::Json(json!({
                "id": format!("chatcmpl-{:016x}", (unit(config.seed, &key, nth, "id") * 1e16) as u64),
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{
                    "index": 0,
                    "message": message,
                    "logprobs": null,
                    "finish_reason": "stop"
                }],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens
                }
            }))
            .into_response()
        }
    }
}

/// Runs `sql` with text parameters in a transaction of its own.
async fn exec(store: &Store, sql: &'static str, params: &[&str]) -> anyhow::Result<()> {
    let mut tx = store.begin().await?;
    let mut q = Sql::new(sql);
    for p in params {
        q = q.bind(*p);
    }
    q.execute(tx.conn()).await?;
    tx.commit().await?;
    Ok(())
}
