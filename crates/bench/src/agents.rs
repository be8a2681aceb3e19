//! The `agents` bench: sagas whose steps wait on the outside world, run by
//! [`agentsaga_runtime::CallingAgent`]s with the runtime's default settings.
//!
//! N sagas (500; `--quick`: 100) of 3 sequential steps, `step_a` (agent `agent_a`,
//! compensation to `agent_a`), `step_b` (likewise) and `step_c` (agent `agent_c`, the
//! pivot), are started at once. Each agent is a `CallingAgent` whose `call` awaits a
//! `tokio::time::sleep` of `--call-ms` (500 ms: no CPU, like waiting for an LLM or an
//! API) and whose `record` writes nothing of its own (the runtime's transaction still
//! records the inbox entry and enqueues the reply).
//!
//! - `makespan`: from just before the first start to the moment the driver sees the last
//!   saga completed (it counts the sagas by state with one query every 20 ms), in ms.
//!   Its floor is the critical path: with every saga's calls overlapping, 3 × call_ms;
//!   beyond the default concurrency of a calling agent (512 deliveries at once), the
//!   sagas go through in waves, one more call_ms per extra wave. Its ratio is
//!   **floor / value** (higher is better, 1.0 is perfect), unlike the other latencies.
//! - `completed`: sagas completed (the run fails unless it is all of them).
//! - `latency_p50` / `latency_p99`: per saga, `updated_at - created_at` of its
//!   `saga_instances` row (start transaction → terminal transaction, ms resolution).
//! - `start_duration`: how long starting all N sagas took (part of the makespan).
//!
//! The N sagas are started with `Runtime::start_saga_in`, 50 per transaction, all
//! transactions at once (each commit wakes the relay): on PostgreSQL they run on
//! several pooled connections, on SQLite one after the other on its single writer, so
//! the first sagas are under way before the last are started. The runtime is
//! `Runtime::builder()` with the three calling agents and the saga, nothing else: no
//! concurrency or relay setting is overridden.
//! Each agent also notes when its `call` and its `record` begin, per saga: the run's
//! phases (start → first call, the call's wait for its transaction, the hand-off from
//! one step's record to the next step's call) go to stderr and into the notes, with
//! the CPU the machine and this process spent during the run (from `/proc`): on two
//! shared cores the makespan varies with the load, and these say why.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentsaga_runtime::{
    AgentContext, CallContext, CallingAgent, DEFAULT_CALLING_CONCURRENCY,
    DEFAULT_ORCHESTRATOR_CONCURRENCY, Runtime, StepError,
};
use agentsaga_saga::{SagaDefinition, SagaState};
use anyhow::{Context, bail, ensure};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::db::{Backend, Scratch};
use crate::outbox::{self, Plain};
use crate::report::percentile;
use crate::report::{Figure, Report, Target};

mod cpu;
mod limited;
mod phases;
mod setup;

use cpu::Cpu;
use phases::{Phases, Probe};
pub(crate) use setup::Args;
use setup::STEPS;

const BENCH: &str = "agents";
const SAGA: &str = "agents";
/// Sagas per start transaction (the transactions run concurrently).
const START_CHUNK: usize = 50;
/// How often the driver counts the sagas by state.
const POLL: Duration = Duration::from_millis(20);
/// The target for ideal / makespan.
const RATIO_TARGET: f64 = 0.6;

/// How much work each backend does.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Sagas per run.
    sagas: usize,
    /// Runs per backend (the run of median makespan is reported).
    rounds: usize,
}

impl Sizes {
    fn new(args: &Args) -> Self {
        let quick = args.common.quick;
        Self {
            sagas: args.sagas.unwrap_or(if quick { 100 } else { 500 }),
            rounds: if quick { 1 } else { 3 },
        }
    }
}

/// The saga data.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Data {
    n: u64,
}

/// A calling agent that sleeps through its call and records nothing of its own.
struct SleepyAgent {
    destination: &'static str,
    step: usize,
    call: Duration,
    probe: Arc<Probe>,
}

#[async_trait::async_trait]
impl CallingAgent for SleepyAgent {
    type Command = Value;
    type Output = ();
    type Reply = &'static str;

    fn destination(&self) -> &str {
        self.destination
    }

    async fn call(&self, ctx: &CallContext<'_>, _command: &Value) -> Result<(), StepError> {
        if !ctx.is_compensation() {
            Probe::note(&self.probe.calls[self.step], ctx.saga_id());
        }
        tokio::time::sleep(self.call).await;
        Ok(())
    }

    async fn record(
        &self,
        ctx: &mut AgentContext<'_>,
        _command: Value,
        (): (),
    ) -> Result<&'static str, StepError> {
        if !ctx.is_compensation() {
            Probe::note(&self.probe.records[self.step], ctx.saga_id());
        }
        Ok("done")
    }
}

fn definition() -> anyhow::Result<SagaDefinition> {
    crate::quick::two_then_pivot(SAGA, STEPS, |d: &Data| d.n)
}

/// The critical path of `n` sagas under the default calling concurrency: the steps
/// one after the other, plus one call per extra wave of sagas.
fn ideal_ms(n: usize, call_ms: u64) -> f64 {
    let waves = n.div_ceil(DEFAULT_CALLING_CONCURRENCY).max(1);
    ((STEPS.len() + waves - 1) as u64 * call_ms) as f64
}

/// What one run measured.
#[derive(Debug, Clone)]
struct Run {
    makespan_ms: f64,
    start_ms: f64,
    completed: usize,
    /// Per-saga latencies, ms, sorted.
    latencies: Vec<f64>,
    phases: Phases,
    /// CPU used during the run (start → last completed).
    cpu: Cpu,
}

/// Runs the `agents` bench on the chosen backends.
pub(crate) async fn run(args: &Args, scratch: &mut Scratch) -> anyhow::Result<Report> {
    if let Some(per_minute) = args.rate_limit {
        return limited::run(args, scratch, per_minute).await;
    }
    let sizes = Sizes::new(args);
    ensure!(sizes.sagas > 0, "--sagas must be at least 1");
    ensure!(args.call_ms > 0, "--call-ms must be at least 1");
    crate::db::ANSWERS_VIA_OUTBOX.store(
        args.common.answers_via_outbox,
        std::sync::atomic::Ordering::Relaxed,
    );
    let call = Duration::from_millis(args.call_ms);
    let ideal = ideal_ms(sizes.sagas, args.call_ms);
    let started = Instant::now();
    let mut report = Report::default();
    report.notes.push(crate::saga::answers_note());
    for backend in args.common.backend.backends() {
        let name = backend.name();
        report.notes.push(scratch.describe(backend).await?);
        let mut runs = Vec::new();
        for round in 0..sizes.rounds {
            let url = scratch.fresh_url(backend).await?;
            let run = one_run(backend, &url, sizes.sagas, call)
                .await
                .with_context(|| format!("{name} run {}", round + 1))?;
            eprintln!(
                "{name:<8} round {}/{}  makespan {:>7.1} ms (ideal {ideal:.0}, ratio {:.3})  \
                 start {:>6.1} ms  p50 {:>7.1} ms  p99 {:>7.1} ms",
                round + 1,
                sizes.rounds,
                run.makespan_ms,
                ideal / run.makespan_ms,
                run.start_ms,
                percentile(&run.latencies, 50.0),
                percentile(&run.latencies, 99.0),
            );
            eprintln!("{name:<8}   phases: {}", run.phases.describe());
            eprintln!("{name:<8}   cpu: {}", run.cpu.describe());
            runs.push(run);
        }
        let median = outbox::median(runs.iter().map(|r| r.makespan_ms).collect());
        let Some(chosen) = runs
            .iter()
            .min_by(|a, b| {
                (a.makespan_ms - median)
                    .abs()
                    .total_cmp(&(b.makespan_ms - median).abs())
            })
            .cloned()
        else {
            bail!("no run");
        };
        let mut latencies: Vec<f64> = runs.iter().flat_map(|r| r.latencies.clone()).collect();
        latencies.sort_by(f64::total_cmp);
        let mut makespan = Figure::new(BENCH, name, "makespan", chosen.makespan_ms, "ms")
            .with_floor(ideal)
            .target(Target::Ratio(RATIO_TARGET));
        // This figure's ratio is floor / value: the share of the makespan that is the
        // critical path (1.0 is perfect).
        makespan.ratio = Some((ideal / makespan.value * 1000.0).round() / 1000.0);
        report.figures.extend([
            makespan,
            Figure::new(BENCH, name, "completed", chosen.completed as f64, "sagas")
                .target(Target::AtLeast(sizes.sagas as f64)),
            Figure::new(
                BENCH,
                name,
                "latency_p50",
                percentile(&latencies, 50.0),
                "ms",
            ),
            Figure::new(
                BENCH,
                name,
                "latency_p99",
                percentile(&latencies, 99.0),
                "ms",
            ),
            Figure::new(BENCH, name, "start_duration", chosen.start_ms, "ms"),
        ]);
        report.notes.push(format!(
            "{name} run of median makespan: phases: {}; cpu during the run: {}",
            chosen.phases.describe(),
            chosen.cpu.describe()
        ));
    }
    let rounds = if sizes.rounds == 1 {
        "one run per backend (--quick: a smoke run, not a measurement)".to_owned()
    } else {
        format!(
            "the run of median makespan of {} per backend (latency percentiles over the \
             sagas of all of them), each in a fresh database",
            sizes.rounds
        )
    };
    report.notes.extend([
        format!(
            "sagas: {} per run, 3 sequential steps (a, b with compensations; c the pivot), \
             each a CallingAgent whose call sleeps {} ms (tokio::time::sleep, no CPU) and \
             whose record writes nothing of its own; started with start_saga_in, \
             {START_CHUNK} per transaction, all transactions at once (start_duration: until \
             the last committed); makespan = first start -> last saga \
             completed, seen by counting sagas by state every {} ms; {rounds}",
            sizes.sagas,
            args.call_ms,
            POLL.as_millis()
        ),
        format!(
            "runtime: Runtime::builder() defaults, nothing overridden ({DEFAULT_CALLING_CONCURRENCY} \
             deliveries at once per calling agent, {DEFAULT_ORCHESTRATOR_CONCURRENCY} per saga version, relay batch 100, \
             workers enough for every actor, poll 250 ms); one process, the store's own pool"
        ),
        format!(
            "makespan floor = the critical path ({} steps x {} ms{}); its ratio is floor / \
             value (higher is better), unlike the other latencies; completed must be every \
             saga or the bench fails; latency = updated_at - created_at of each saga \
             (start transaction -> terminal transaction, ms clock)",
            STEPS.len(),
            args.call_ms,
            if sizes.sagas > DEFAULT_CALLING_CONCURRENCY {
                ", plus one call per extra wave of 512 sagas"
            } else {
                ""
            }
        ),
        format!(
            "whole run: {:.1} s; target: makespan ratio >= {RATIO_TARGET}",
            started.elapsed().as_secs_f64()
        ),
    ]);
    Ok(report)
}

/// Starts the runtime on a fresh database, starts `n` sagas at once and waits for all.
async fn one_run(backend: Backend, url: &str, n: usize, call: Duration) -> anyhow::Result<Run> {
    let probe = Arc::new(Probe::default());
    let mut builder = Runtime::builder()
        .database(url)
        .answers_in_agent_transaction(!crate::db::answers_via_outbox())
        .saga(definition()?);
    for (step, (_, destination)) in STEPS.into_iter().enumerate() {
        builder = builder.calling_agent(SleepyAgent {
            destination,
            step,
            call,
            probe: Arc::clone(&probe),
        });
    }
    let runtime = Arc::new(builder.start().await?);
    let before = Cpu::now();
    let result = drive(&runtime, n, call).await;
    let cpu = Cpu::now().since(&before);
    match Arc::into_inner(runtime) {
        Some(runtime) => runtime.shutdown().await,
        None => bail!("the runtime is still shared after the run"),
    }
    let (begin, makespan, start) = result?;
    let phases = Phases::of(&probe, begin, call);
    let (completed, latencies) = check_and_measure(backend, url, n).await?;
    Ok(Run {
        makespan_ms: makespan.as_secs_f64() * 1000.0,
        start_ms: start.as_secs_f64() * 1000.0,
        completed,
        latencies,
        phases,
        cpu,
    })
}

/// Starts `n` sagas, [`START_CHUNK`] per transaction, all transactions at once, and
/// waits until all are completed. Returns (the run's start, first start → last
/// completed, the time until every start transaction had committed).
async fn drive(
    runtime: &Arc<Runtime>,
    n: usize,
    call: Duration,
) -> anyhow::Result<(Instant, Duration, Duration)> {
    let store = runtime.store();
    let begin = Instant::now();
    let mut starts = tokio::task::JoinSet::new();
    for first in (0..n).step_by(START_CHUNK) {
        let runtime = Arc::clone(runtime);
        starts.spawn(async move {
            let mut tx = runtime.store().begin().await?;
            for i in first..(first + START_CHUNK).min(n) {
                runtime
                    .start_saga_in(&mut tx, SAGA, &Data { n: i as u64 })
                    .await?;
            }
            tx.commit().await?;
            anyhow::Ok(())
        });
    }
    while let Some(started) = starts.join_next().await {
        started.context("a start task failed")??;
    }
    let start = begin.elapsed();
    // Generous: a hundred critical paths, at least a minute.
    let deadline = begin + (call * 300).max(Duration::from_secs(60));
    loop {
        let mut completed = 0;
        let mut open = 0;
        for (state, count) in agentsaga_saga::query::count_by_state(store).await? {
            match state {
                SagaState::Completed => completed += count as usize,
                SagaState::Running => open += count as usize,
                other => bail!("{count} sagas are {other}: every saga should complete"),
            }
        }
        if completed == n {
            return Ok((begin, begin.elapsed(), start));
        }
        if Instant::now() > deadline {
            bail!(
                "{open} sagas still running and {completed} of {n} completed after {:.0} s",
                begin.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Checks that all `n` sagas completed; returns their number and sorted latencies (ms).
async fn check_and_measure(
    backend: Backend,
    url: &str,
    n: usize,
) -> anyhow::Result<(usize, Vec<f64>)> {
    let plain = Plain::open(backend, url).await?;
    let rows = plain.saga_rows().await?;
    plain.close().await;
    let completed = rows.iter().filter(|r| r.0 == "completed").count();
    ensure!(
        rows.len() == n && completed == n,
        "expected all {n} sagas completed, found {completed} completed of {}",
        rows.len()
    );
    let mut ms: Vec<f64> = rows.iter().map(|r| (r.2 - r.1) as f64).collect();
    ms.sort_by(f64::total_cmp);
    Ok((completed, ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_builds() {
        let d = definition().unwrap();
        assert_eq!(
            d.agent_destinations(),
            vec!["agent_a", "agent_b", "agent_c"]
        );
    }

    #[test]
    fn the_ideal_is_the_critical_path() {
        assert_eq!(ideal_ms(500, 500), 1500.0);
        assert_eq!(ideal_ms(1, 100), 300.0);
        assert_eq!(ideal_ms(DEFAULT_CALLING_CONCURRENCY + 1, 500), 2000.0);
    }
}
