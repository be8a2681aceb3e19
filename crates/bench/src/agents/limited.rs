//! `agents --rate-limit R`: sagas whose one step calls a rate-limited provider.
//!
//! N sagas (1,000; `--quick`: 100) of one step, `ask`, whose agent (`llm`, a
//! `CallingAgent`) calls a stub provider that allows R requests a minute with a burst
//! of one second's worth (`R / 60` requests): past that it answers 429 with the
//! `Retry-After` it would accept, as an LLM provider does. The call then takes
//! `--call-ms` (100 ms; a sleep). The runtime declares the provider's pace,
//! `RateLimit::requests_per_minute(R)` (no burst: calls evenly spaced), so every call
//! waits for its slot (reserved in the database) instead of being refused.
//!
//! - `limited_makespan`: first start -> last saga completed, ms. Its floor is what the
//!   limit allows: the last of N calls evenly spaced at `60 s / R` starts
//!   `(N - 1) × 60 s / R` after the first, and takes `call_ms`. Its ratio is floor /
//!   value (the target: within 10 % of the floor, ratio >= 0.9).
//! - `limited_429s`: calls the stub refused (target: none).
//! - `limited_completed`: sagas completed (all of them, or the run fails).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentsaga_runtime::{AgentContext, CallContext, CallingAgent, RateLimit, Runtime, StepError};
use agentsaga_saga::{Saga, SagaState, Step};
use anyhow::{Context, bail, ensure};
use serde_json::Value;

use super::setup::Args;
use crate::db::Scratch;
use crate::report::{Figure, Report, Target};

const BENCH: &str = "agents";
const SAGA: &str = "limited";
/// The target: a makespan within 10 % of what the limit allows.
const RATIO_TARGET: f64 = 0.9;

/// The stub provider: R requests a minute, a burst of a second's worth, in memory
/// (GCRA: the time the next request is due; a request earlier than that minus the
/// burst is refused).
struct Provider {
    interval: Duration,
    burst: Duration,
    due: Mutex<Option<Instant>>,
    refused: AtomicU64,
    served: AtomicU64,
}

impl Provider {
    fn new(per_minute: u32) -> Self {
        let interval = Duration::from_secs(60) / per_minute;
        Self {
            interval,
            burst: interval * (per_minute / 60).max(1),
            due: Mutex::new(None),
            refused: AtomicU64::new(0),
            served: AtomicU64::new(0),
        }
    }

    /// Takes a request now, or says how long until it would be taken.
    fn take(&self) -> Result<(), Duration> {
        let now = Instant::now();
        let mut due = self
            .due
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let next = due.unwrap_or(now);
        let early = next
            .checked_sub(self.burst)
            .and_then(|t| t.checked_duration_since(now))
            .filter(|d| !d.is_zero());
        if let Some(early) = early {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(early);
        }
        *due = Some(next.max(now) + self.interval);
        self.served.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

struct Llm {
    provider: Arc<Provider>,
    call: Duration,
}

#[async_trait::async_trait]
impl CallingAgent for Llm {
    type Command = Value;
    type Output = ();
    type Reply = &'static str;

    fn destination(&self) -> &str {
        "llm"
    }

    async fn call(&self, _: &CallContext<'_>, _: &Value) -> Result<(), StepError> {
        if let Err(wait) = self.provider.take() {
            return Err(StepError::rate_limited(Some(wait)));
        }
        tokio::time::sleep(self.call).await;
        Ok(())
    }

    async fn record(
        &self,
        _: &mut AgentContext<'_>,
        _: Value,
        (): (),
    ) -> Result<&'static str, StepError> {
        Ok("answered")
    }
}

/// Runs the rate-limited shape on the chosen backends.
pub(crate) async fn run(
    args: &Args,
    scratch: &mut Scratch,
    per_minute: u32,
) -> anyhow::Result<Report> {
    ensure!(per_minute > 0, "--rate-limit must be at least 1");
    let n = args
        .sagas
        .unwrap_or(if args.common.quick { 100 } else { 1_000 });
    ensure!(n > 0, "--sagas must be at least 1");
    let call = Duration::from_millis(args.limited_call_ms);
    let interval_ms = 60_000.0 / f64::from(per_minute);
    let floor = (n - 1) as f64 * interval_ms + call.as_secs_f64() * 1000.0;
    let mut report = Report::default();
    for backend in args.common.backend.backends() {
        let name = backend.name();
        report.notes.push(scratch.describe(backend).await?);
        let url = scratch.fresh_url(backend).await?;
        let provider = Arc::new(Provider::new(per_minute));
        let runtime = Runtime::builder()
            .database(url.as_str())
            .calling_agent(Llm {
                provider: Arc::clone(&provider),
                call,
            })
            .rate_limit("llm", RateLimit::requests_per_minute(per_minute))
            .saga(
                Saga::<Value>::builder(SAGA, 1)
                    .pivot(Step::new("ask", "llm"))
                    .build()?,
            )
            .start()
            .await?;
        let makespan = drive(&runtime, n, floor)
            .await
            .with_context(|| format!("{name} rate-limited run"))?;
        runtime.shutdown().await;
        let refused = provider.refused.load(Ordering::Relaxed);
        let makespan_ms = makespan.as_secs_f64() * 1000.0;
        eprintln!(
            "{name:<8} rate-limited  makespan {makespan_ms:>8.1} ms (floor {floor:.0}, ratio {:.3})  \
             429s {refused}  served {}",
            floor / makespan_ms,
            provider.served.load(Ordering::Relaxed)
        );
        let mut figure = Figure::new(BENCH, name, "limited_makespan", makespan_ms, "ms")
            .with_floor(floor)
            .target(Target::Ratio(RATIO_TARGET));
        figure.ratio = Some((floor / makespan_ms * 1000.0).round() / 1000.0);
        report.figures.extend([
            figure,
            Figure::new(BENCH, name, "limited_429s", refused as f64, "calls")
                .target(Target::AtMost(0.0)),
            Figure::new(BENCH, name, "limited_completed", n as f64, "sagas")
                .target(Target::AtLeast(n as f64)),
        ]);
    }
    report.notes.push(format!(
        "rate-limited: {n} sagas of one step whose CallingAgent calls a stub provider \
         allowing {per_minute} requests a minute with a burst of a second's worth (429 with \
         Retry-After past it), then sleeps {} ms; the runtime declares \
         RateLimit::requests_per_minute({per_minute}) for it (no burst); all sagas started \
         at once (start_saga, one transaction each); makespan floor = (n - 1) x 60 s / \
         {per_minute} + the call; ratio = floor / makespan",
        call.as_millis()
    ));
    Ok(report)
}

/// Starts `n` sagas and waits until all complete: first start -> last completed.
async fn drive(runtime: &Runtime, n: usize, floor_ms: f64) -> anyhow::Result<Duration> {
    let begin = Instant::now();
    for i in 0..n {
        runtime
            .start_saga(SAGA, &serde_json::json!({ "n": i }))
            .await?;
    }
    let deadline = begin + Duration::from_secs_f64(floor_ms / 1000.0 * 3.0 + 60.0);
    loop {
        let mut completed = 0;
        for (state, count) in agentsaga_saga::query::count_by_state(runtime.store()).await? {
            match state {
                SagaState::Completed => completed += count as usize,
                SagaState::Running => {}
                other => bail!("{count} sagas are {other}: every saga should complete"),
            }
        }
        if completed == n {
            return Ok(begin.elapsed());
        }
        ensure!(
            Instant::now() < deadline,
            "{completed} of {n} completed after {:.0} s",
            begin.elapsed().as_secs_f64()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stub_refuses_past_its_burst() {
        let p = Provider::new(60_000); // one a millisecond, a burst of 1,000
        let taken = (0..1_200).filter(|_| p.take().is_ok()).count();
        assert!((1_000..1_100).contains(&taken), "{taken}");
        assert!(p.refused.load(Ordering::Relaxed) > 0);
    }
}
