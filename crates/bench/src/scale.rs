//! The `scale` bench: one burst of N trip-shaped sagas on the runtime's defaults, for
//! growing N, each on a fresh database in a fresh process.
//!
//! The saga has the shape of `examples/trip_booking.rs`: `reserve_flight` (agent
//! `flights`), then `reserve_hotel` (`hotels`) and `reserve_car` (`cars`) in parallel,
//! each with a cancel compensation to its own agent, then `charge_payment`
//! (`payments`, the pivot), then `send_confirmation` (`confirmations`); every step has
//! the example's retry policy and its 20 s `timeout` except the confirmation (as in the
//! example). The five agents are plain [`Agent`]s whose handler writes nothing of its
//! own and answers at once (the runtime's transaction still records the inbox entry and
//! enqueues the reply); nothing fails.
//!
//! For each N (1,000, 4,000, 16,000, 64,000; `--quick`: 500, 2,000; `--sizes` to
//! choose), the bench re-executes itself as the hidden `scale-child` on a fresh
//! database: a fresh runtime (`Runtime::builder()` with the agents and the saga,
//! nothing overridden, so admission control lets at most 1,000 sagas of the name be in
//! flight and queues the rest in `saga_starts`), which starts all N sagas as one burst
//! (`Runtime::start_saga_in`, [`START_CHUNK`] per transaction, one transaction after
//! the other, as fast as they commit), then waits for every saga to be terminal
//! (counting by state every [`POLL`], and no start left waiting; it fails past
//! [`patience`]). The child prints one JSON line of results; progress goes to stderr
//! every [`PROGRESS`]: sagas finished, in flight and waiting, the interval's rate, the
//! process's CPU and the machine's, RSS, the relay's deliveries and their latency, and
//! how long an empty transaction took (on SQLite: the wait for the one writer).
//!
//! Per N: `rate_n{N}` (N / first start → last `finished_at`), `completed_share_n{N}`,
//! `p99_latency_n{N}` (`finished_at - created_at` of `saga_instances`: from the saga's
//! admission, so without its wait in `saga_starts`; on PostgreSQL both are transaction
//! start times), `p99_latency_end_to_end_n{N}` (from the commit of its start
//! transaction, so with that wait), `peak_rss_n{N}` (the child's
//! `VmHWM`, MiB) and `db_size_n{N}` (MiB: SQLite file + WAL; PostgreSQL
//! `pg_database_size`), measured when the last saga is done. Then
//! `rate_ratio_largest_smallest` and `rss_ratio_largest_smallest`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use agentsaga_core::{ReadPool, RetryPolicy};
use agentsaga_runtime::{Agent, AgentContext, Runtime, StepError};
use agentsaga_saga::{
    DEFAULT_MAX_IN_FLIGHT, Engine, Saga, SagaDefinition, SagaId, SagaState, Step,
};
use anyhow::{Context, bail, ensure};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::Common;
use crate::db::{Backend, Scratch};
use crate::outbox;
use crate::relay::percentile;
use crate::report::{Figure, Report, Target};

const BENCH: &str = "scale";
const SAGA: &str = "trip";
/// Sagas started per transaction.
const START_CHUNK: usize = 500;
/// How often the child counts the sagas by state.
const POLL: Duration = Duration::from_millis(200);
/// How often the child reports progress on stderr.
const PROGRESS: Duration = Duration::from_secs(2);
/// How long one N may take after its burst before the run fails: this, or
/// [`PATIENCE_PER_SAGA`] per saga if longer (25 sagas/s at 64,000).
const PATIENCE: Duration = Duration::from_secs(600);
const PATIENCE_PER_SAGA: Duration = Duration::from_millis(40);
/// The step timeout, as in the example.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);
/// Targets from the issue.
const RATE_RATIO_TARGET: f64 = 0.8;
const RSS_RATIO_TARGET: f64 = 2.0;
/// Sizes.
const FULL_SIZES: [usize; 4] = [1_000, 4_000, 16_000, 64_000];
const QUICK_SIZES: [usize; 2] = [500, 2_000];
/// The agents' destinations.
const AGENTS: [&str; 5] = ["flights", "hotels", "cars", "payments", "confirmations"];

/// `scale` options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: Common,
    /// The burst sizes, comma-separated (default 1000,4000,16000,64000; --quick:
    /// 500,2000).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
}

/// The hidden `scale-child` subcommand: one burst of `sagas` on `url`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ChildArgs {
    /// `sqlite` or `postgres`.
    #[arg(long)]
    backend: String,
    /// The (fresh) database.
    #[arg(long)]
    url: String,
    /// Sagas in the burst.
    #[arg(long)]
    sagas: usize,
}

/// What the child measured, printed as one JSON line.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Outcome {
    sagas: usize,
    completed: usize,
    /// Terminal or stuck, but not completed.
    other: usize,
    /// N / (first start → the last saga's `finished_at`), sagas/s.
    rate: f64,
    /// N / (first start → the poll that saw the last saga terminal), sagas/s.
    rate_by_poll: f64,
    /// First start → last transaction of the burst committed, ms.
    burst_ms: f64,
    /// First start → the last saga's `finished_at`, ms.
    makespan_ms: f64,
    latency_p50: f64,
    latency_p99: f64,
    end_to_end_p50: f64,
    end_to_end_p99: f64,
    /// VmHWM when the last saga was done, MiB.
    peak_rss_mib: f64,
    /// VmRSS then, MiB.
    rss_mib: f64,
    db_size_mib: f64,
    /// Relay deliveries, and their enqueue → delivered latency (histogram bounds).
    delivered: u64,
    relay_p50_ms: Option<u64>,
    relay_p99_ms: Option<u64>,
}

/// The saga data (`trip_booking`'s `Trip`, without the bookings list).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Trip {
    customer: u64,
    amount_cents: u64,
}

/// Runs the `scale` bench on the chosen backends.
pub(crate) async fn run(args: &Args, scratch: &mut Scratch) -> anyhow::Result<Report> {
    let mut sizes = if !args.sizes.is_empty() {
        args.sizes.clone()
    } else if args.common.quick {
        QUICK_SIZES.to_vec()
    } else {
        FULL_SIZES.to_vec()
    };
    ensure!(
        sizes.iter().all(|&n| n > 0),
        "--sizes must all be at least 1"
    );
    sizes.sort_unstable();
    sizes.dedup();
    let started = Instant::now();
    let mut report = Report::default();
    for backend in args.common.backend.backends() {
        let name = backend.name();
        report.notes.push(scratch.describe(backend).await?);
        let mut outcomes: Vec<Outcome> = Vec::new();
        for &n in &sizes {
            let url = scratch.fresh_url(backend).await?;
            let outcome = child_run(backend, &url, n)
                .await
                .with_context(|| format!("{name} N = {n}"))?;
            eprintln!(
                "{name:<8} N {n:>6}  rate {:>7.1} sagas/s (by poll {:.1})  burst {:.0} ms  \
                 makespan {:.0} ms  p99 {:.0} ms (end to end {:.0} ms)  peak RSS {:.1} MiB  \
                 db {:.1} MiB  completed {}/{n}",
                outcome.rate,
                outcome.rate_by_poll,
                outcome.burst_ms,
                outcome.makespan_ms,
                outcome.latency_p99,
                outcome.end_to_end_p99,
                outcome.peak_rss_mib,
                outcome.db_size_mib,
                outcome.completed,
            );
            let share = outcome.completed as f64 / n as f64;
            let mut completed =
                Figure::new(BENCH, name, metric("completed_share", n), share, "share")
                    .target(Target::AtLeast(1.0));
            // Unrounded: 63,999 of 64,000 must not show as 1.0.
            completed.value = share;
            report.figures.extend([
                Figure::new(BENCH, name, metric("rate", n), outcome.rate, "sagas/s"),
                completed,
                Figure::new(
                    BENCH,
                    name,
                    metric("p99_latency", n),
                    outcome.latency_p99,
                    "ms",
                ),
                Figure::new(
                    BENCH,
                    name,
                    metric("p99_latency_end_to_end", n),
                    outcome.end_to_end_p99,
                    "ms",
                ),
                Figure::new(
                    BENCH,
                    name,
                    metric("peak_rss", n),
                    outcome.peak_rss_mib,
                    "MiB",
                ),
                Figure::new(
                    BENCH,
                    name,
                    metric("db_size", n),
                    outcome.db_size_mib,
                    "MiB",
                ),
            ]);
            outcomes.push(outcome);
        }
        if let (Some(small), Some(large)) = (outcomes.first(), outcomes.last())
            && outcomes.len() > 1
        {
            report.figures.extend([
                Figure::new(
                    BENCH,
                    name,
                    "rate_ratio_largest_smallest",
                    large.rate / small.rate,
                    "ratio",
                )
                .target(Target::AtLeast(RATE_RATIO_TARGET)),
                Figure::new(
                    BENCH,
                    name,
                    "rss_ratio_largest_smallest",
                    large.peak_rss_mib / small.peak_rss_mib,
                    "ratio",
                )
                .target(Target::AtMost(RSS_RATIO_TARGET)),
            ]);
        }
        let detail: Vec<String> = outcomes
            .iter()
            .map(|o| {
                format!(
                    "N={}: burst committed in {:.0} ms, makespan {:.1} s, p50 {:.0} ms \
                     (end to end {:.0} ms), RSS at the end {:.1} MiB, {} relay deliveries \
                     (enqueue -> delivered p50 <= {} ms, p99 <= {} ms)",
                    o.sagas,
                    o.burst_ms,
                    o.makespan_ms / 1000.0,
                    o.latency_p50,
                    o.end_to_end_p50,
                    o.rss_mib,
                    o.delivered,
                    o.relay_p50_ms.map_or("?".into(), |v| v.to_string()),
                    o.relay_p99_ms.map_or("?".into(), |v| v.to_string()),
                )
            })
            .collect();
        report
            .notes
            .push(format!("{name} per N: {}", detail.join("; ")));
    }
    report.notes.extend([
        format!(
            "sagas: trip-shaped (reserve_flight; reserve_hotel + reserve_car in parallel; \
             charge_payment, the pivot; send_confirmation), {} s step timeouts and the \
             example's retry policy, five Agents that write nothing of their own, nothing \
             failing; all N started as one burst with start_saga_in, {START_CHUNK} per \
             transaction, one transaction after the other",
            STEP_TIMEOUT.as_secs()
        ),
        format!(
            "runtime: Runtime::builder() defaults, nothing overridden (admission: at most \
             {DEFAULT_MAX_IN_FLIGHT} sagas in flight, the rest wait in saga_starts); each N \
             in its own process (the hidden scale-child) on a fresh database"
        ),
        format!(
            "rate = N / (first start -> the last saga's finished_at); the end is detected \
             by counting sagas by state every {} ms (and no start waiting); p99_latency = \
             finished_at - created_at (from admission; on postgres both are transaction \
             start times); end_to_end from the commit of the \
             start transaction (with the wait in saga_starts, so it grows with N by design); \
             peak_rss = the child's VmHWM when the last saga is done; db_size = SQLite file \
             + WAL, or pg_database_size, then",
            POLL.as_millis()
        ),
        format!(
            "whole run: {:.1} s; targets: completed share 1.0 at every N, rate at the largest \
             N >= {RATE_RATIO_TARGET} x rate at the smallest, peak RSS at the largest <= \
             {RSS_RATIO_TARGET} x at the smallest{}",
            started.elapsed().as_secs_f64(),
            if args.common.quick {
                " (--quick: a smoke run, not a measurement)"
            } else {
                ""
            }
        ),
    ]);
    Ok(report)
}

/// How long the sagas of a burst of `n` may take to finish.
fn patience(n: usize) -> Duration {
    PATIENCE.max(PATIENCE_PER_SAGA * u32::try_from(n).unwrap_or(u32::MAX))
}

/// `name_n{n}`, leaked: a handful per run.
fn metric(name: &str, n: usize) -> &'static str {
    Box::leak(format!("{name}_n{n}").into_boxed_str())
}

/// Runs one burst in a `scale-child` process and reads its outcome.
async fn child_run(backend: Backend, url: &str, n: usize) -> anyhow::Result<Outcome> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut child = tokio::process::Command::new(exe)
        .arg("scale-child")
        .arg("--backend")
        .arg(backend.name())
        .arg("--url")
        .arg(url)
        .arg("--sagas")
        .arg(n.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting scale-child")?;
    let stdout = child.stdout.take().context("no stdout from scale-child")?;
    let mut lines = BufReader::new(stdout).lines();
    // The child bounds its own wait; this is only against a hung child.
    let patience = patience(n) + PATIENCE;
    let read = async {
        let mut last = None;
        while let Some(line) = lines.next_line().await? {
            if line.starts_with('{') {
                last = Some(line);
            }
        }
        anyhow::Ok(last)
    };
    let line = tokio::time::timeout(patience, read)
        .await
        .context("scale-child did not finish in time")??;
    let status = child.wait().await?;
    ensure!(status.success(), "scale-child failed: {status}");
    let line = line.context("scale-child printed no outcome")?;
    serde_json::from_str(&line).with_context(|| format!("reading {line}"))
}

// ----- the child ----------------------------------------------------------------------

/// An agent that answers at once and writes nothing of its own.
struct FastAgent {
    destination: &'static str,
}

#[async_trait::async_trait]
impl Agent for FastAgent {
    type Command = Value;
    type Reply = &'static str;

    fn destination(&self) -> &str {
        self.destination
    }

    async fn handle(
        &self,
        ctx: &mut AgentContext<'_>,
        _command: Value,
    ) -> Result<&'static str, StepError> {
        Ok(if ctx.is_compensation() {
            "cancelled"
        } else {
            "ok"
        })
    }
}

/// `trip_booking`'s shape, timeouts and retry policy.
fn definition() -> anyhow::Result<SagaDefinition> {
    let retry = RetryPolicy::new(Duration::from_millis(50), Duration::from_secs(1), 5);
    let booking = |name: &str, destination: &'static str| {
        Step::<Trip>::new(name, destination)
            .command(|t: &Trip| serde_json::json!({ "op": "reserve", "customer": t.customer }))
            .compensate(
                destination,
                |_: &Trip| serde_json::json!({ "op": "cancel" }),
            )
            .retry(retry)
            .timeout(STEP_TIMEOUT)
    };
    Ok(Saga::<Trip>::builder(SAGA, 1)
        .step(booking("reserve_flight", "flights"))
        .parallel([
            booking("reserve_hotel", "hotels"),
            booking("reserve_car", "cars"),
        ])
        .pivot(
            Step::new("charge_payment", "payments")
                .retry(retry)
                .timeout(STEP_TIMEOUT),
        )
        .step(Step::new("send_confirmation", "confirmations").retry(retry))
        .build()?)
}

/// The hidden `scale-child` subcommand: one burst, its outcome as one JSON line.
pub(crate) async fn child(args: &ChildArgs) -> anyhow::Result<()> {
    use std::io::Write as _;
    ensure!(args.sagas > 0, "--sagas must be at least 1");
    let backend = match args.backend.as_str() {
        "sqlite" => Backend::Sqlite,
        "postgres" => Backend::Postgres,
        other => bail!("unknown backend {other}"),
    };
    let mut builder = Runtime::builder().database(&args.url).saga(definition()?);
    for destination in AGENTS {
        builder = builder.agent(FastAgent { destination });
    }
    let runtime = builder.start().await?;
    let result = burst(&runtime, backend, &args.url, args.sagas).await;
    runtime.shutdown().await;
    let outcome = result?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&outcome)?)?;
    out.flush()?;
    Ok(())
}

/// Starts `n` sagas as one burst, waits for all, measures.
async fn burst(
    runtime: &Runtime,
    backend: Backend,
    url: &str,
    n: usize,
) -> anyhow::Result<Outcome> {
    let store = runtime.store();
    let tag = format!("{:<8} N {n:>6}", backend.name());
    let begin_ms = outbox::now_ms();
    let begin = Instant::now();
    // Per start transaction: its last saga id and when it committed (wall-clock ms).
    // Saga ids are UUIDv7, ordered by creation within a process, so a saga's
    // transaction is the first whose last id is not below its own: no per-saga map
    // (which would weigh in the peak RSS at 64,000 sagas).
    let mut committed: Vec<(SagaId, i64)> = Vec::with_capacity(n.div_ceil(START_CHUNK));
    let mut previous: Option<SagaId> = None;
    for first in (0..n).step_by(START_CHUNK) {
        let mut tx = store.begin().await?;
        for i in first..(first + START_CHUNK).min(n) {
            let trip = Trip {
                customer: i as u64,
                amount_cents: 10_000 + i as u64 % 90_000,
            };
            let id = runtime.start_saga_in(&mut tx, SAGA, &trip).await?;
            ensure!(
                previous.is_none_or(|p| p < id),
                "saga ids out of creation order: {id} after {previous:?}"
            );
            previous = Some(id);
        }
        tx.commit().await?;
        if let Some(last) = previous {
            committed.push((last, outbox::now_ms()));
        }
    }
    let burst = begin.elapsed();
    eprintln!(
        "{tag}  burst of {n} starts committed in {:.0} ms  {}",
        burst.as_secs_f64() * 1000.0,
        memory()
    );

    // Wait for every saga to be terminal (or stuck) and no start to be waiting.
    let patience = patience(n);
    let deadline = Instant::now() + patience;
    let mut last_report = (
        Instant::now(),
        0usize,
        cpu_seconds(),
        machine_busy_seconds(),
    );
    let detected = loop {
        // Waiting first: a start admitted in between is then seen among the instances.
        let waiting: u64 = Engine::waiting_starts(store)
            .await?
            .iter()
            .map(|(_, c)| c)
            .sum();
        let (mut done, mut open) = (0usize, 0usize);
        for (state, count) in agentsaga_saga::query::count_by_state(store).await? {
            match state {
                SagaState::Running | SagaState::Compensating => open += count as usize,
                _ => done += count as usize,
            }
        }
        let now = Instant::now();
        let finished = waiting == 0 && open == 0 && done >= n;
        if finished || now.duration_since(last_report.0) >= PROGRESS {
            let stats = runtime.relay_stats().unwrap_or_default();
            // How long a transaction waits for a connection (SQLite: the one writer).
            let probe = Instant::now();
            store.begin().await?.commit().await?;
            let probe_ms = probe.elapsed().as_secs_f64() * 1000.0;
            let dt = now.duration_since(last_report.0).as_secs_f64();
            eprintln!(
                "{tag}  t {:>6.1} s  finished {done:>6}  in flight {open:>5}  waiting \
                 {waiting:>6}  last interval {:>7.1} sagas/s, CPU {:>3.0} % (machine {:>3.0} %)  {}  \
                 relay delivered {:>7} retried {} (p50 <= {} ms, p99 <= {} ms)  empty \
                 transaction {probe_ms:.1} ms",
                begin.elapsed().as_secs_f64(),
                (done - last_report.1.min(done)) as f64 / dt.max(1e-9),
                (cpu_seconds() - last_report.2) * 100.0 / dt.max(1e-9),
                (machine_busy_seconds() - last_report.3) * 100.0 / dt.max(1e-9),
                memory(),
                stats.delivered,
                stats.retried,
                stats.latency_p50_ms.unwrap_or(0),
                stats.latency_p99_ms.unwrap_or(0),
            );
            last_report = (now, done, cpu_seconds(), machine_busy_seconds());
        }
        if finished {
            break begin.elapsed();
        }
        if now > deadline {
            bail!(
                "{open} sagas in flight, {waiting} starts waiting and {done} of {n} finished \
                 {:.0} s after the burst",
                patience.as_secs_f64()
            );
        }
        tokio::time::sleep(POLL).await;
    };

    // Memory and size now, before reading the rows back.
    let peak_rss_mib = proc_status_mib("VmHWM:").context("reading VmHWM")?;
    let rss_mib = proc_status_mib("VmRSS:").context("reading VmRSS")?;
    let db_size_mib = db_size(store.reader(), url).await? / (1024.0 * 1024.0);
    let stats = runtime.relay_stats().unwrap_or_default();

    // (id, state, created_at ms, finished_at ms)
    let rows: Vec<(SagaId, String, i64, Option<i64>)> = match store.reader() {
        ReadPool::Sqlite(reader) => {
            let rows: Vec<(String, String, i64, Option<i64>)> =
                sqlx::query_as("SELECT id, state, created_at, finished_at FROM saga_instances")
                    .fetch_all(reader)
                    .await?;
            rows.into_iter()
                .map(|(id, s, c, f)| Ok((id.parse()?, s, c, f)))
                .collect::<anyhow::Result<_>>()?
        }
        ReadPool::Postgres(pool) => {
            let rows: Vec<(uuid::Uuid, String, i64, Option<i64>)> = sqlx::query_as(
                "SELECT id, state, (extract(epoch FROM created_at) * 1000)::bigint,
                        (extract(epoch FROM finished_at) * 1000)::bigint
                 FROM saga_instances",
            )
            .fetch_all(pool)
            .await?;
            rows.into_iter()
                .map(|(id, s, c, f)| (SagaId::from(id), s, c, f))
                .collect()
        }
    };
    ensure!(
        rows.len() == n,
        "{} saga instances for {n} starts",
        rows.len()
    );
    let completed = rows.iter().filter(|r| r.1 == "completed").count();
    let mut latencies = Vec::with_capacity(n);
    let mut end_to_end = Vec::with_capacity(n);
    let mut last_finished = begin_ms;
    for (id, _, created, finished) in &rows {
        let Some(finished) = *finished else { continue };
        last_finished = last_finished.max(finished);
        latencies.push((finished - created) as f64);
        if let Some((_, start)) = committed.get(committed.partition_point(|(last, _)| last < id)) {
            end_to_end.push((finished - start).max(0) as f64);
        }
    }
    latencies.sort_by(f64::total_cmp);
    end_to_end.sort_by(f64::total_cmp);
    let makespan_ms = ((last_finished - begin_ms) as f64).max(1.0);
    Ok(Outcome {
        sagas: n,
        completed,
        other: n - completed,
        rate: n as f64 / (makespan_ms / 1000.0),
        rate_by_poll: n as f64 / detected.as_secs_f64(),
        burst_ms: burst.as_secs_f64() * 1000.0,
        makespan_ms,
        latency_p50: percentile(&latencies, 50.0),
        latency_p99: percentile(&latencies, 99.0),
        end_to_end_p50: percentile(&end_to_end, 50.0),
        end_to_end_p99: percentile(&end_to_end, 99.0),
        peak_rss_mib,
        rss_mib,
        db_size_mib,
        delivered: stats.delivered,
        relay_p50_ms: stats.latency_p50_ms,
        relay_p99_ms: stats.latency_p99_ms,
    })
}

/// The database's size in bytes: SQLite file + WAL, or `pg_database_size`.
async fn db_size(db: ReadPool<'_>, url: &str) -> anyhow::Result<f64> {
    match db {
        ReadPool::Sqlite(_) => {
            let path = url
                .strip_prefix("sqlite://")
                .with_context(|| format!("not a sqlite:// URL: {url}"))?;
            let path = PathBuf::from(path.split('?').next().unwrap_or(path));
            let mut wal = path.clone().into_os_string();
            wal.push("-wal");
            let len = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
            Ok((len(&path) + len(std::path::Path::new(&wal))) as f64)
        }
        ReadPool::Postgres(pool) => {
            let size: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
                .fetch_one(pool)
                .await?;
            Ok(size as f64)
        }
    }
}

/// CPU time of this process so far (user + system), in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the `(comm)`: state is field 3; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // The kernel's USER_HZ is 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// Busy CPU time of the whole machine so far (all cores), in seconds.
fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
    let busy: f64 = ticks
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, t)| t)
        .sum();
    busy / 100.0
}

/// `RSS 18.1 MiB (anon 12.0, file 5.1, shmem 1.0)`.
fn memory() -> String {
    let mib = |f| proc_status_mib(f).unwrap_or(f64::NAN);
    format!(
        "RSS {:>5.1} MiB (anon {:.1}, file {:.1}, shmem {:.1})",
        mib("VmRSS:"),
        mib("RssAnon:"),
        mib("RssFile:"),
        mib("RssShmem:")
    )
}

/// A `kB` line of `/proc/self/status` (`VmHWM:`, `VmRSS:`), in MiB.
fn proc_status_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line[field.len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_builds() {
        let d = definition().unwrap();
        let mut agents = AGENTS.to_vec();
        agents.sort_unstable();
        assert_eq!(d.agent_destinations(), agents);
    }

    #[test]
    fn reads_proc_status() {
        let hwm = proc_status_mib("VmHWM:").unwrap();
        let rss = proc_status_mib("VmRSS:").unwrap();
        assert!(hwm > 0.0 && rss > 0.0 && hwm >= rss * 0.99, "{hwm} {rss}");
    }

    #[test]
    fn patience_grows_with_n() {
        assert_eq!(patience(1_000), PATIENCE);
        assert_eq!(patience(64_000), Duration::from_secs(2_560));
    }

    #[test]
    fn metric_names() {
        assert_eq!(metric("rate", 64_000), "rate_n64000");
    }
}
