//! The LLM client.

use super::*;

/// An OpenAI-compatible chat-completions client.
pub(super) struct Llm {
    pub(super) http: reqwest::Client,
    pub(super) endpoint: String,
    pub(super) api_key: Option<String>,
    pub(super) model: String,
    pub(super) timeout: Duration,
}

#[derive(Deserialize)]
pub(super) struct Completion {
    pub(super) choices: Vec<Choice>,
    /// What the request used, as the API counts it.
    #[serde(default)]
    pub(super) usage: Option<TokenUsage>,
}

#[derive(Deserialize)]
pub(super) struct TokenUsage {
    #[serde(default)]
    pub(super) prompt_tokens: u64,
    #[serde(default)]
    pub(super) completion_tokens: u64,
}

#[derive(Deserialize, Clone)]
pub(super) struct Choice {
    pub(super) message: AssistantMessage,
}

#[derive(Deserialize, Clone)]
pub(super) struct AssistantMessage {
    #[serde(default)]
    pub(super) content: Option<String>,
    #[serde(default)]
    pub(super) refusal: Option<String>,
}

/// At most `n` characters of `s`, for error messages.
pub(super) fn clip(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// An error with its sources: reqwest's own message says little ("error sending
/// request"), the cause is further down.
pub(super) fn chain(e: &dyn std::error::Error) -> String {
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
    pub(super) fn new(
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
    pub(super) async fn chat(
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
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            // The provider's own pace: `retry-after-ms` (OpenAI's), else `Retry-After`
            // in seconds. The runtime pauses the destination that long, for every
            // process, and calls again without spending a step retry.
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            let after = header("retry-after-ms")
                .map(Duration::from_millis)
                .or_else(|| header("retry-after").map(Duration::from_secs));
            return Err(StepError::rate_limited(after));
        }
        let text = response.text().await.map_err(|e| {
            StepError::retryable(format!(
                "LLM reply from {} cut short ({status}): {}",
                self.endpoint,
                chain(&e)
            ))
        })?;
        let (answer, usage) = read_reply(&self.endpoint, status.as_u16(), &text)?;
        if let Some(u) = usage {
            // Counts against the saga's budget (and settles a tokens-per-minute limit).
            ctx.report_usage(Usage::tokens(u.prompt_tokens, u.completion_tokens));
        }
        Ok(answer)
    }
}

/// What an endpoint's answer means: the model's text and what it used, or the step's
/// error.
pub(super) fn read_reply(
    endpoint: &str,
    status: u16,
    body: &str,
) -> Result<(String, Option<TokenUsage>), StepError> {
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
    let Some(choice) = completion.choices.first().cloned() else {
        return Err(StepError::fatal(format!(
            "LLM reply from {endpoint} has no choices"
        )));
    };
    if let Some(refusal) = choice.message.refusal {
        return Err(StepError::fatal(format!("the model refused: {refusal}")));
    }
    match choice.message.content {
        Some(text) if !text.trim().is_empty() => Ok((text, completion.usage)),
        _ => Err(StepError::fatal(format!(
            "LLM reply from {endpoint} has no content in choices[0].message"
        ))),
    }
}
