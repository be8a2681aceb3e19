//! The `saga` bench: 3-step no-op sagas run by [`agentsaga_runtime::Runtime`], against
//! the same transactions written by hand in plain sqlx (the *floor*).
//!
//! The saga: `step_a` (agent `agent_a`, compensation to `agent_a`), `step_b` (likewise),
//! `step_c` (agent `agent_c`, the pivot). The agents do nothing but answer; `agent_c`
//! fails fatally when the saga data says `fail`, which sends the saga back through the
//! compensations of `step_b` then `step_a`.
//!
//! - `happy_rate`: N sagas, none failing, in sagas/s (N / time from the first start to
//!   the last saga terminal).
//! - `compensating_rate`: the same with every 5th saga failing at `step_c` (20 %).
//! - `*_latency_p50` / `*_latency_p99`: per saga, `updated_at - created_at` of its
//!   `saga_instances` row (start transaction → terminal transaction, ms resolution),
//!   over the same runs.
//!
//! Both sides are driven alike: sagas are started 50 per transaction (like the
//! `trip_booking` example), a new batch whenever at most 150 are unfinished (so at most
//! 200 in flight), until N are started; then the driver waits for the last.
//!
//! The floor writes, per saga, the rows the runtime writes, in the same transactions:
//! the start (instance + first step row + its command in the outbox, 50 sagas per
//! transaction); per agent delivery an inbox row + the reply in the outbox; per
//! orchestrator delivery an inbox row + the instance and step updates + the next
//! command (or compensation) in the outbox. It hands messages from one transaction to
//! the next through an in-memory queue worked by 8 tasks (the relay's 8 workers): no
//! relay, so no claims and no acknowledgements, and no reads of the saga back.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agentsaga_relay::RelayConfig;
use agentsaga_runtime::{Agent, AgentContext, Runtime, StepError};
use agentsaga_saga::{Saga, SagaDefinition, SagaState, Step};
use anyhow::{Context, bail, ensure};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::{Postgres, Sqlite, Transaction};
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::Common;
use crate::db::{Backend, Scratch};
use crate::outbox::{self, Plain};
use crate::relay::percentile;
use crate::report::{Figure, Report, Target};

const BENCH: &str = "saga";
const SAGA: &str = "bench";
/// `saga.<name>.v<version>`: where replies go.
const ORCHESTRATOR: &str = "saga.bench.v1";
/// (step name, agent destination), in order; the last is the pivot.
const STEPS: [(&str, &str); 3] = [
    ("step_a", "agent_a"),
    ("step_b", "agent_b"),
    ("step_c", "agent_c"),
];
/// Sagas per start transaction.
const START_BATCH: usize = 50;
/// At most this many sagas unfinished.
const WINDOW: usize = 200;
/// 1 in this many sagas fails at `step_c` in the compensating runs.
const FAIL_EVERY: u64 = 5;
/// How often the driver looks at the unfinished count.
const POLL: Duration = Duration::from_millis(10);
/// Targets from the issue.
const SQLITE_TARGET: f64 = 2_500.0;
const POSTGRES_TARGET: f64 = 1_000.0;
const RATIO_TARGET: f64 = 0.5;

/// `saga` options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: Common,
    /// The runtime relay's delivery workers (its default: 8), and the floor's tasks. A
    /// relay keeps up to workers + batch size rows in flight.
    #[arg(long, default_value_t = 8)]
    workers: usize,
}

/// How much work each figure does.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Sagas per run.
    sagas: usize,
    /// Runs per side and scenario (the median is reported).
    rounds: usize,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                sagas: 300,
                rounds: 1,
            }
        } else {
            Self {
                sagas: 2_000,
                rounds: 2,
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Happy,
    Compensating,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Self::Happy => "happy",
            Self::Compensating => "compensating",
        }
    }

    fn fails(self, n: u64) -> bool {
        self == Self::Compensating && n.is_multiple_of(FAIL_EVERY)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Runtime,
    Floor,
}

/// The saga data.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Data {
    n: u64,
    fail: bool,
}

/// What one run measured.
#[derive(Debug, Clone)]
struct Run {
    rate: f64,
    /// Per-saga latencies, ms, sorted.
    latencies: Vec<f64>,
}

/// Runs the `saga` bench on the chosen backends.
pub(crate) async fn run(args: &Args, scratch: &mut Scratch) -> anyhow::Result<Report> {
    ensure!(args.workers > 0, "--workers must be at least 1");
    let sizes = Sizes::new(args.common.quick);
    let started = Instant::now();
    let mut report = Report::default();
    for backend in args.common.backend.backends() {
        let name = backend.name();
        report.notes.push(scratch.describe(backend).await?);
        let absolute = match backend {
            Backend::Sqlite => SQLITE_TARGET,
            Backend::Postgres => POSTGRES_TARGET,
        };
        for scenario in [Scenario::Happy, Scenario::Compensating] {
            let (runtime, floor) = figure(backend, scenario, sizes, args.workers, scratch)
                .await
                .with_context(|| format!("{name} {}", scenario.name()))?;
            let metric = |m: &str| -> &'static str {
                match (scenario, m) {
                    (Scenario::Happy, "rate") => "happy_rate",
                    (Scenario::Happy, "p50") => "happy_latency_p50",
                    (Scenario::Happy, _) => "happy_latency_p99",
                    (Scenario::Compensating, "rate") => "compensating_rate",
                    (Scenario::Compensating, "p50") => "compensating_latency_p50",
                    (Scenario::Compensating, _) => "compensating_latency_p99",
                }
            };
            report.figures.extend([
                Figure::new(BENCH, name, metric("rate"), runtime.rate, "sagas/s")
                    .with_floor(floor.rate)
                    .target(Target::AtLeast(absolute))
                    .target(Target::Ratio(RATIO_TARGET)),
                Figure::new(
                    BENCH,
                    name,
                    metric("p50"),
                    percentile(&runtime.latencies, 50.0),
                    "ms",
                )
                .with_floor(percentile(&floor.latencies, 50.0)),
                Figure::new(
                    BENCH,
                    name,
                    metric("p99"),
                    percentile(&runtime.latencies, 99.0),
                    "ms",
                )
                .with_floor(percentile(&floor.latencies, 99.0)),
            ]);
        }
    }
    let rounds = if sizes.rounds == 1 {
        "one run per side and scenario (--quick: a smoke run, not a measurement)".to_owned()
    } else {
        format!(
            "median of {} runs per side and scenario (latency percentiles over the sagas \
             of all of them), runtime and floor alternating which goes first, each run in \
             a fresh database",
            sizes.rounds
        )
    };
    report.notes.extend([
        format!(
            "sagas: {} per run, 3 no-op steps (a, b with compensations; c the pivot); \
             compensating runs fail step c fatally for every {FAIL_EVERY}th saga (from the \
             saga data), which then compensates b and a. Started {START_BATCH} per \
             transaction whenever at most {} are unfinished ({WINDOW} in flight at most); \
             rate = N / (first start -> last terminal, polled every {} ms); {rounds}",
            sizes.sagas,
            WINDOW - START_BATCH,
            POLL.as_millis()
        ),
        format!(
            "runtime: Runtime::builder() defaults (4 actors per agent and per saga version; \
             relay batch 100, poll 250 ms) with {} relay workers, up to {} rows in flight, \
             acknowledged with the next claim; one process, the store's own pool",
            args.workers,
            args.workers + 100
        ),
        format!(
            "floor: the same row writes in the same transactions in plain sqlx (start: \
             instance + step row + command, {START_BATCH} sagas per transaction; agent: \
             inbox + reply; orchestrator: inbox + instance/step updates + next command or \
             compensation), {} tasks handing the messages on in memory: no \
             relay claims or acks, no saga loads, a failed step writes its reply without \
             the runtime's rollback-and-retry of the agent transaction",
            args.workers
        ),
        "latency: updated_at - created_at of each saga (start transaction -> terminal \
         transaction, ms clock; on postgres transaction start times), under the run's own \
         load, so mostly queueing behind the other sagas in flight; its ratio is value / \
         floor too, so lower is better there"
            .to_owned(),
        format!(
            "whole run: {:.1} s; targets: sqlite >= {SQLITE_TARGET} sagas/s, postgres >= \
             {POSTGRES_TARGET} sagas/s, ratio >= {RATIO_TARGET}",
            started.elapsed().as_secs_f64()
        ),
    ]);
    Ok(report)
}

/// (runtime, floor): the runs of median rate.
async fn figure(
    backend: Backend,
    scenario: Scenario,
    sizes: Sizes,
    workers: usize,
    scratch: &mut Scratch,
) -> anyhow::Result<(Run, Run)> {
    let mut runs = (Vec::new(), Vec::new());
    for round in 0..sizes.rounds {
        let order = if round % 2 == 0 {
            [Side::Floor, Side::Runtime]
        } else {
            [Side::Runtime, Side::Floor]
        };
        for side in order {
            let url = scratch.fresh_url(backend).await?;
            let run = match side {
                Side::Runtime => runtime_run(backend, &url, scenario, sizes.sagas, workers).await?,
                Side::Floor => floor_run(backend, &url, scenario, sizes.sagas, workers).await?,
            };
            eprintln!(
                "{:<8} {:<12} round {}/{}  {:<7} {:>8.0} sagas/s  p50 {:>6.1} ms  p99 {:>6.1} ms",
                backend.name(),
                scenario.name(),
                round + 1,
                sizes.rounds,
                match side {
                    Side::Runtime => "runtime",
                    Side::Floor => "floor",
                },
                run.rate,
                percentile(&run.latencies, 50.0),
                percentile(&run.latencies, 99.0),
            );
            match side {
                Side::Runtime => runs.0.push(run),
                Side::Floor => runs.1.push(run),
            }
        }
    }
    Ok((pooled(runs.0), pooled(runs.1)))
}

/// The median rate of `runs`, and the latencies of all their sagas together.
fn pooled(runs: Vec<Run>) -> Run {
    let rate = outbox::median(runs.iter().map(|r| r.rate).collect());
    let mut latencies: Vec<f64> = runs.into_iter().flat_map(|r| r.latencies).collect();
    latencies.sort_by(f64::total_cmp);
    Run { rate, latencies }
}

/// Starts sagas `START_BATCH` at a time while at most `WINDOW - START_BATCH` are
/// unfinished, until `n` are started and none is unfinished. `start(first, count)`
/// starts sagas `first..first + count` in one transaction; `unfinished(started)`
/// counts those not terminal. Returns the elapsed time.
async fn drive<S, SF, U, UF>(n: usize, mut start: S, mut unfinished: U) -> anyhow::Result<Duration>
where
    S: FnMut(usize, usize) -> SF,
    SF: Future<Output = anyhow::Result<()>>,
    U: FnMut(usize) -> UF,
    UF: Future<Output = anyhow::Result<usize>>,
{
    let begin = Instant::now();
    let deadline = begin + Duration::from_secs(600);
    let mut started = 0;
    loop {
        let open = unfinished(started).await?;
        if started < n && open + START_BATCH <= WINDOW {
            let count = START_BATCH.min(n - started);
            start(started, count).await?;
            started += count;
            continue;
        }
        if started == n && open == 0 {
            return Ok(begin.elapsed());
        }
        if Instant::now() > deadline {
            bail!("{open} sagas still unfinished after 10 minutes ({started} of {n} started)");
        }
        tokio::time::sleep(POLL).await;
    }
}

// ----- the runtime -----------------------------------------------------------------------

/// An agent that answers at once; `agent_c` fails fatally when the command says `fail`.
struct NoOpAgent {
    destination: &'static str,
}

#[async_trait::async_trait]
impl Agent for NoOpAgent {
    type Command = Value;
    type Reply = &'static str;

    fn destination(&self) -> &str {
        self.destination
    }

    async fn handle(
        &self,
        ctx: &mut AgentContext<'_>,
        command: Value,
    ) -> Result<&'static str, StepError> {
        if self.destination == STEPS[2].1
            && !ctx.is_compensation()
            && command.get("fail").and_then(Value::as_bool) == Some(true)
        {
            return Err(StepError::fatal("declined"));
        }
        Ok("done")
    }
}

fn definition() -> anyhow::Result<SagaDefinition> {
    let [(a, agent_a), (b, agent_b), (c, agent_c)] = STEPS;
    Ok(Saga::<Data>::builder(SAGA, 1)
        .step(Step::new(a, agent_a).compensate(agent_a, |d: &Data| d.n))
        .step(Step::new(b, agent_b).compensate(agent_b, |d: &Data| d.n))
        .pivot(Step::new(c, agent_c))
        .build()?)
}

async fn runtime_run(
    backend: Backend,
    url: &str,
    scenario: Scenario,
    n: usize,
    workers: usize,
) -> anyhow::Result<Run> {
    let mut builder = Runtime::builder()
        .database(url)
        .saga(definition()?)
        .relay_config(RelayConfig::default().workers(workers));
    for (_, destination) in STEPS {
        builder = builder.agent(NoOpAgent { destination });
    }
    let runtime = builder.start().await?;
    let store = runtime.store().clone();
    let elapsed = drive(
        n,
        |first, count| {
            let runtime = &runtime;
            async move {
                let mut tx = runtime.store().begin().await?;
                for i in first..first + count {
                    let n = i as u64;
                    let data = Data {
                        n,
                        fail: scenario.fails(n),
                    };
                    runtime.start_saga_in(&mut tx, SAGA, &data).await?;
                }
                tx.commit().await?;
                Ok(())
            }
        },
        |started| {
            let store = store.clone();
            async move {
                let mut done = 0u64;
                for (state, count) in agentsaga_saga::query::count_by_state(&store).await? {
                    match state {
                        SagaState::Completed | SagaState::Compensated => done += count,
                        SagaState::Running | SagaState::Compensating => {}
                        other => bail!("{count} sagas are {other}"),
                    }
                }
                Ok(started.saturating_sub(done as usize))
            }
        },
    )
    .await;
    runtime.shutdown().await;
    let elapsed = elapsed?;
    let latencies = check_and_measure(backend, url, scenario, n).await?;
    Ok(Run {
        rate: n as f64 / elapsed.as_secs_f64(),
        latencies,
    })
}

/// Checks the final states (every saga terminal, the expected number compensated) and
/// returns the sorted latencies, ms.
async fn check_and_measure(
    backend: Backend,
    url: &str,
    scenario: Scenario,
    n: usize,
) -> anyhow::Result<Vec<f64>> {
    let plain = Plain::open(backend, url).await?;
    let rows: Vec<(String, i64, i64)> = match &plain {
        Plain::Sqlite(pool) => {
            sqlx::query_as("SELECT state, created_at, updated_at FROM saga_instances")
                .fetch_all(pool)
                .await?
        }
        Plain::Postgres(pool) => {
            sqlx::query_as(
                "SELECT state, (extract(epoch FROM created_at) * 1000)::bigint,
                    (extract(epoch FROM updated_at) * 1000)::bigint
                 FROM saga_instances",
            )
            .fetch_all(pool)
            .await?
        }
    };
    plain.close().await;
    let failing = (0..n as u64).filter(|&i| scenario.fails(i)).count();
    let compensated = rows.iter().filter(|r| r.0 == "compensated").count();
    let completed = rows.iter().filter(|r| r.0 == "completed").count();
    ensure!(
        rows.len() == n && completed == n - failing && compensated == failing,
        "expected {} completed and {failing} compensated of {n}, found {completed} and \
         {compensated} of {}",
        n - failing,
        rows.len()
    );
    let mut ms: Vec<f64> = rows.iter().map(|r| (r.2 - r.1) as f64).collect();
    ms.sort_by(f64::total_cmp);
    Ok(ms)
}

// ----- the floor ---------------------------------------------------------------------------

/// One saga, as the floor's messages carry it.
#[derive(Debug, Clone, Copy)]
struct SagaRef {
    id: Uuid,
    n: u64,
    fail: bool,
}

/// A message handed from one floor transaction to the next.
#[derive(Debug, Clone, Copy)]
enum Hop {
    /// A command (or, `comp`, a compensation) for the agent of step `idx`.
    Agent {
        saga: SagaRef,
        idx: usize,
        comp: bool,
        message: Uuid,
    },
    /// The agent's reply to the orchestrator.
    Orchestrator {
        saga: SagaRef,
        idx: usize,
        comp: bool,
        ok: bool,
        message: Uuid,
    },
}

/// What a floor transaction leads to.
enum Next {
    Hop(Hop),
    Done,
}

/// A statement in both dialects, with the same parameters in the same order. Times
/// are Unix ms; PostgreSQL converts them with `to_timestamp`.
struct Sql {
    sqlite: &'static str,
    pg: &'static str,
}

/// A parameter, bound as each backend stores it.
enum Arg {
    /// UUID on PostgreSQL, its text on SQLite.
    Id(Uuid),
    Text(String),
    OptText(Option<String>),
    Int(i32),
    Ms(i64),
    Bool(bool),
}

enum FloorTx {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
}

impl FloorTx {
    async fn begin(plain: &Plain) -> anyhow::Result<Self> {
        Ok(match plain {
            Plain::Sqlite(pool) => Self::Sqlite(pool.begin_with("BEGIN IMMEDIATE").await?),
            Plain::Postgres(pool) => Self::Postgres(pool.begin().await?),
        })
    }

    async fn exec(&mut self, sql: &Sql, args: Vec<Arg>) -> anyhow::Result<()> {
        match self {
            Self::Sqlite(tx) => {
                let mut q = sqlx::query(sql.sqlite);
                for arg in args {
                    q = match arg {
                        Arg::Id(u) => q.bind(u.to_string()),
                        Arg::Text(s) => q.bind(s),
                        Arg::OptText(s) => q.bind(s),
                        Arg::Int(i) => q.bind(i64::from(i)),
                        Arg::Ms(ms) => q.bind(ms),
                        Arg::Bool(b) => q.bind(b),
                    };
                }
                q.execute(&mut **tx).await?;
            }
            Self::Postgres(tx) => {
                let mut q = sqlx::query(sql.pg);
                for arg in args {
                    q = match arg {
                        Arg::Id(u) => q.bind(u),
                        Arg::Text(s) => q.bind(s),
                        Arg::OptText(s) => q.bind(s),
                        Arg::Int(i) => q.bind(i),
                        Arg::Ms(ms) => q.bind(ms),
                        Arg::Bool(b) => q.bind(b),
                    };
                }
                q.execute(&mut **tx).await?;
            }
        }
        Ok(())
    }

    async fn commit(self) -> anyhow::Result<()> {
        match self {
            Self::Sqlite(tx) => tx.commit().await?,
            Self::Postgres(tx) => tx.commit().await?,
        }
        Ok(())
    }
}

const INSERT_INSTANCE: Sql = Sql {
    sqlite:
        "INSERT INTO saga_instances (id, name, version, state, data, stage, created_at, updated_at)
             VALUES (?1, ?2, 1, 'running', ?3, 0, ?4, ?4)",
    pg: "INSERT INTO saga_instances (id, name, version, state, data, stage, created_at, updated_at)
         VALUES ($1, $2, 1, 'running', $3::jsonb, 0, to_timestamp($4 / 1000.0),
                 to_timestamp($4 / 1000.0))",
};

/// (saga, idx, name, destination, command id, input, compensation destination,
/// compensation payload, compensation state, now)
const INSERT_STEP: Sql = Sql {
    sqlite: "INSERT INTO saga_steps (saga_id, idx, stage, name, destination, state, attempts,
                command_id, input, compensation_destination, compensation_payload,
                compensation_state, dispatched_at)
             VALUES (?1, ?2, ?2, ?3, ?4, 'dispatched', 1, ?5, ?6, ?7, ?8, ?9, ?10)",
    pg: "INSERT INTO saga_steps (saga_id, idx, stage, name, destination, state, attempts,
            command_id, input, compensation_destination, compensation_payload,
            compensation_state, dispatched_at)
         VALUES ($1, $2, $2, $3, $4, 'dispatched', 1, $5, $6::jsonb, $7, $8::jsonb, $9,
                 to_timestamp($10 / 1000.0))",
};

/// (id, destination, key, payload, headers, now): the store's INSERT.
const INSERT_OUTBOX: Sql = Sql {
    sqlite: "INSERT INTO outbox (id, destination, key, payload, headers, available_at, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)
             ON CONFLICT (id) DO NOTHING",
    pg: "INSERT INTO outbox (id, destination, key, payload, headers, available_at)
         VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, to_timestamp($6 / 1000.0))
         ON CONFLICT (id) DO NOTHING",
};

/// (consumer, message id, now): the store's receive.
const INSERT_INBOX: Sql = Sql {
    sqlite: "INSERT INTO inbox (consumer, message_id, received_at) VALUES (?1, ?2, ?3)
             ON CONFLICT DO NOTHING",
    pg: "INSERT INTO inbox (consumer, message_id, received_at)
         VALUES ($1, $2, to_timestamp($3 / 1000.0))
         ON CONFLICT DO NOTHING",
};

/// (saga, state, stage, error, finished, now)
const UPDATE_INSTANCE: Sql = Sql {
    sqlite: "UPDATE saga_instances SET state = ?2, stage = ?3, error = ?4, updated_at = ?6,
                 finished_at = CASE WHEN ?5 THEN ?6 END
             WHERE id = ?1",
    pg: "UPDATE saga_instances SET state = $2, stage = $3, error = $4,
             updated_at = to_timestamp($6 / 1000.0),
             finished_at = CASE WHEN $5 THEN to_timestamp($6 / 1000.0) END
         WHERE id = $1",
};

/// (saga, idx, state, output, error, now)
const UPDATE_STEP: Sql = Sql {
    sqlite: "UPDATE saga_steps SET state = ?3, output = ?4, error = ?5, replied_at = ?6
             WHERE saga_id = ?1 AND idx = ?2",
    pg: "UPDATE saga_steps SET state = $3, output = $4::jsonb, error = $5,
             replied_at = to_timestamp($6 / 1000.0)
         WHERE saga_id = $1 AND idx = $2",
};

/// (saga, idx, compensation message id)
const COMPENSATION_SENT: Sql = Sql {
    sqlite: "UPDATE saga_steps SET compensation_state = 'dispatched',
                 compensation_attempts = compensation_attempts + 1, compensation_message_id = ?3
             WHERE saga_id = ?1 AND idx = ?2",
    pg: "UPDATE saga_steps SET compensation_state = 'dispatched',
             compensation_attempts = compensation_attempts + 1, compensation_message_id = $3
         WHERE saga_id = $1 AND idx = $2",
};

/// (saga, idx, now)
const COMPENSATION_DONE: Sql = Sql {
    sqlite: "UPDATE saga_steps SET compensation_state = 'done', compensated_at = ?3
             WHERE saga_id = ?1 AND idx = ?2",
    pg: "UPDATE saga_steps SET compensation_state = 'done',
             compensated_at = to_timestamp($3 / 1000.0)
         WHERE saga_id = $1 AND idx = $2",
};

fn data_json(saga: SagaRef) -> String {
    json!({ "n": saga.n, "fail": saga.fail }).to_string()
}

/// The outbox row of a command or compensation to step `idx`'s agent.
fn command_row(saga: SagaRef, idx: usize, comp: bool, id: Uuid, now: i64) -> Vec<Arg> {
    let (name, destination) = STEPS[idx];
    let payload = if comp {
        saga.n.to_string()
    } else {
        data_json(saga)
    };
    let headers = json!({
        "kind": if comp { "compensate" } else { "command" },
        "reply_to": ORCHESTRATOR,
        "saga_id": saga.id.to_string(),
        "step": idx.to_string(),
        "step_name": name,
    });
    vec![
        Arg::Id(id),
        Arg::Text(destination.to_owned()),
        Arg::OptText(Some(format!("{}:{idx}", saga.id))),
        Arg::Text(payload),
        Arg::Text(headers.to_string()),
        Arg::Ms(now),
    ]
}

/// Writes step `idx`'s row (dispatched, with its compensation recorded) and its command.
async fn dispatch(tx: &mut FloorTx, saga: SagaRef, idx: usize, now: i64) -> anyhow::Result<Hop> {
    let (name, destination) = STEPS[idx];
    let command = Uuid::now_v7();
    let undoable = idx < 2;
    tx.exec(
        &INSERT_STEP,
        vec![
            Arg::Id(saga.id),
            Arg::Int(idx as i32),
            Arg::Text(name.to_owned()),
            Arg::Text(destination.to_owned()),
            Arg::Id(command),
            Arg::Text(data_json(saga)),
            Arg::OptText(undoable.then(|| destination.to_owned())),
            Arg::OptText(undoable.then(|| saga.n.to_string())),
            Arg::OptText(undoable.then(|| "recorded".to_owned())),
            Arg::Ms(now),
        ],
    )
    .await?;
    tx.exec(&INSERT_OUTBOX, command_row(saga, idx, false, command, now))
        .await?;
    Ok(Hop::Agent {
        saga,
        idx,
        comp: false,
        message: command,
    })
}

/// Sends the compensation of step `idx`.
async fn compensate(tx: &mut FloorTx, saga: SagaRef, idx: usize, now: i64) -> anyhow::Result<Hop> {
    let message = Uuid::now_v7();
    tx.exec(
        &COMPENSATION_SENT,
        vec![Arg::Id(saga.id), Arg::Int(idx as i32), Arg::Id(message)],
    )
    .await?;
    tx.exec(&INSERT_OUTBOX, command_row(saga, idx, true, message, now))
        .await?;
    Ok(Hop::Agent {
        saga,
        idx,
        comp: true,
        message,
    })
}

async fn set_instance(
    tx: &mut FloorTx,
    saga: SagaRef,
    state: &str,
    stage: usize,
    error: Option<&str>,
    now: i64,
) -> anyhow::Result<()> {
    let finished = matches!(state, "completed" | "compensated");
    tx.exec(
        &UPDATE_INSTANCE,
        vec![
            Arg::Id(saga.id),
            Arg::Text(state.to_owned()),
            Arg::Int(stage as i32),
            Arg::OptText(error.map(str::to_owned)),
            Arg::Bool(finished),
            Arg::Ms(now),
        ],
    )
    .await
}

/// The start transaction of sagas `first..first + count`; returns their first hops.
async fn floor_start(
    plain: &Plain,
    scenario: Scenario,
    first: usize,
    count: usize,
) -> anyhow::Result<Vec<Hop>> {
    let now = outbox::now_ms();
    let mut tx = FloorTx::begin(plain).await?;
    let mut hops = Vec::with_capacity(count);
    for i in first..first + count {
        let n = i as u64;
        let saga = SagaRef {
            id: Uuid::now_v7(),
            n,
            fail: scenario.fails(n),
        };
        tx.exec(
            &INSERT_INSTANCE,
            vec![
                Arg::Id(saga.id),
                Arg::Text(SAGA.to_owned()),
                Arg::Text(data_json(saga)),
                Arg::Ms(now),
            ],
        )
        .await?;
        hops.push(dispatch(&mut tx, saga, 0, now).await?);
    }
    tx.commit().await?;
    Ok(hops)
}

/// One delivery's transaction.
async fn floor_hop(plain: &Plain, hop: Hop) -> anyhow::Result<Next> {
    let now = outbox::now_ms();
    let mut tx = FloorTx::begin(plain).await?;
    let next = match hop {
        Hop::Agent {
            saga,
            idx,
            comp,
            message,
        } => {
            let (name, destination) = STEPS[idx];
            tx.exec(
                &INSERT_INBOX,
                vec![
                    Arg::Text(destination.to_owned()),
                    Arg::Id(message),
                    Arg::Ms(now),
                ],
            )
            .await?;
            let ok = comp || idx < 2 || !saga.fail;
            let outcome = if ok {
                json!({ "ok": "done" })
            } else {
                json!({ "fatal": "declined" })
            };
            let headers = json!({
                "kind": "reply",
                "causation_id": message.to_string(),
                "saga_id": saga.id.to_string(),
                "step": idx.to_string(),
                "step_name": name,
            });
            let reply = Uuid::now_v7();
            tx.exec(
                &INSERT_OUTBOX,
                vec![
                    Arg::Id(reply),
                    Arg::Text(ORCHESTRATOR.to_owned()),
                    Arg::OptText(None),
                    Arg::Text(outcome.to_string()),
                    Arg::Text(headers.to_string()),
                    Arg::Ms(now),
                ],
            )
            .await?;
            Next::Hop(Hop::Orchestrator {
                saga,
                idx,
                comp,
                ok,
                message: reply,
            })
        }
        Hop::Orchestrator {
            saga,
            idx,
            comp,
            ok,
            message,
        } => {
            tx.exec(
                &INSERT_INBOX,
                vec![
                    Arg::Text(ORCHESTRATOR.to_owned()),
                    Arg::Id(message),
                    Arg::Ms(now),
                ],
            )
            .await?;
            let step = |state: &str, output: Option<&str>, error: Option<&str>| {
                vec![
                    Arg::Id(saga.id),
                    Arg::Int(idx as i32),
                    Arg::Text(state.to_owned()),
                    Arg::OptText(output.map(str::to_owned)),
                    Arg::OptText(error.map(str::to_owned)),
                    Arg::Ms(now),
                ]
            };
            match (comp, ok) {
                (false, true) => {
                    tx.exec(&UPDATE_STEP, step("succeeded", Some("\"done\""), None))
                        .await?;
                    if idx + 1 < STEPS.len() {
                        let next = dispatch(&mut tx, saga, idx + 1, now).await?;
                        set_instance(&mut tx, saga, "running", idx + 1, None, now).await?;
                        Next::Hop(next)
                    } else {
                        set_instance(&mut tx, saga, "completed", idx, None, now).await?;
                        Next::Done
                    }
                }
                (false, false) => {
                    tx.exec(&UPDATE_STEP, step("failed", None, Some("declined")))
                        .await?;
                    let error = format!("step `{}` failed: declined", STEPS[idx].0);
                    set_instance(&mut tx, saga, "compensating", idx, Some(&error), now).await?;
                    // The pivot has nothing to undo: compensate the step before it.
                    Next::Hop(compensate(&mut tx, saga, idx - 1, now).await?)
                }
                (true, _) => {
                    tx.exec(
                        &COMPENSATION_DONE,
                        vec![Arg::Id(saga.id), Arg::Int(idx as i32), Arg::Ms(now)],
                    )
                    .await?;
                    let error = format!("step `{}` failed: declined", STEPS[2].0);
                    if idx > 0 {
                        let next = compensate(&mut tx, saga, idx - 1, now).await?;
                        set_instance(&mut tx, saga, "compensating", 2, Some(&error), now).await?;
                        Next::Hop(next)
                    } else {
                        set_instance(&mut tx, saga, "compensated", 2, Some(&error), now).await?;
                        Next::Done
                    }
                }
            }
        }
    };
    tx.commit().await?;
    Ok(next)
}

async fn floor_run(
    backend: Backend,
    url: &str,
    scenario: Scenario,
    n: usize,
    workers: usize,
) -> anyhow::Result<Run> {
    let plain = Plain::open(backend, url).await?;
    let (queue, inbox) = mpsc::unbounded_channel::<Hop>();
    let inbox = Arc::new(Mutex::new(inbox));
    let finished = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..workers {
        let (plain, queue, inbox, finished) = (
            plain.clone(),
            queue.clone(),
            Arc::clone(&inbox),
            Arc::clone(&finished),
        );
        tasks.spawn(async move {
            loop {
                let hop = inbox.lock().await.recv().await;
                let Some(hop) = hop else {
                    return anyhow::Ok(());
                };
                match floor_hop(&plain, hop).await? {
                    Next::Hop(next) => queue.send(next).context("the floor's queue closed")?,
                    Next::Done => {
                        finished.fetch_add(1, Ordering::AcqRel);
                    }
                }
            }
        });
    }
    let tasks = Arc::new(std::sync::Mutex::new(tasks));
    let elapsed = drive(
        n,
        |first, count| {
            let (plain, queue) = (&plain, &queue);
            async move {
                for hop in floor_start(plain, scenario, first, count).await? {
                    queue.send(hop).context("the floor's queue closed")?;
                }
                Ok(())
            }
        },
        |started| {
            let finished = Arc::clone(&finished);
            let tasks = Arc::clone(&tasks);
            async move {
                // A worker that stopped has failed: say why instead of waiting.
                let failed = tasks
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .try_join_next();
                if let Some(done) = failed {
                    done??;
                    bail!("a floor worker stopped");
                }
                Ok(started - finished.load(Ordering::Acquire))
            }
        },
    )
    .await;
    if let Ok(mut set) = tasks.lock() {
        set.abort_all();
    }
    plain.close().await;
    let elapsed = elapsed?;
    let latencies = check_and_measure(backend, url, scenario, n).await?;
    Ok(Run {
        rate: n as f64 / elapsed.as_secs_f64(),
        latencies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_in_five_fails_when_compensating() {
        let fails = (0..100)
            .filter(|&n| Scenario::Compensating.fails(n))
            .count();
        assert_eq!(fails, 20);
        assert!((0..100).all(|n| !Scenario::Happy.fails(n)));
    }

    #[test]
    fn the_definition_builds() {
        let d = definition().unwrap();
        assert_eq!(d.orchestrator_destination(), ORCHESTRATOR);
        assert_eq!(
            d.agent_destinations(),
            vec!["agent_a", "agent_b", "agent_c"]
        );
    }
}
