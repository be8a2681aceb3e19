//! The `scale-child` process of the `scale` bench: a fresh runtime with five no-op
//! agents, one burst of N sagas, and what it measured (from the store and `/proc`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use agentsaga_core::{ReadPool, RetryPolicy, Sql};
use agentsaga_runtime::Runtime;
use agentsaga_saga::{Engine, Saga, SagaDefinition, SagaId, SagaState, Step};
use anyhow::{Context, bail, ensure};
use serde::{Deserialize, Serialize};

use super::{AGENTS, Outcome, POLL, PROGRESS, SAGA, START_CHUNK, STEP_TIMEOUT, patience};
use crate::db::Backend;
use crate::outbox;
use crate::quick::QuickAgent;
use crate::report::percentile;

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

/// The saga data (`trip_booking`'s `Trip`, without the bookings list).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Trip {
    customer: u64,
    amount_cents: u64,
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
        // Answers at once and writes nothing of its own.
        builder = builder.agent(QuickAgent {
            destination,
            answers: ("ok", "cancelled"),
            refuses: |_, _| false,
        });
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
    let rows: Vec<(SagaId, String, i64, Option<i64>)> =
        Sql::new("SELECT id, state, created_at, finished_at FROM saga_instances")
            .fetch_all(store.reader())
            .await?
            .iter()
            .map(|r| {
                Ok((
                    SagaId::from(r.uuid("id")?),
                    r.text("state")?,
                    r.int("created_at")?,
                    r.opt_int("finished_at")?,
                ))
            })
            .collect::<agentsaga_core::Result<_>>()?;
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
    if db.backend() == "sqlite" {
        {
            let path = url
                .strip_prefix("sqlite://")
                .with_context(|| format!("not a sqlite:// URL: {url}"))?;
            let path = PathBuf::from(path.split('?').next().unwrap_or(path));
            let mut wal = path.clone().into_os_string();
            wal.push("-wal");
            let len = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
            Ok((len(&path) + len(std::path::Path::new(&wal))) as f64)
        }
    } else {
        let size = Sql::new("SELECT pg_database_size(current_database()) AS size")
            .fetch_one(db)
            .await?
            .int("size")?;
        Ok(size as f64)
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

/// This process's resident set (`VmRSS`), MiB.
pub(crate) fn rss_mib() -> Option<f64> {
    proc_status_mib("VmRSS:")
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
        // The resident size first: the peak read after it is at least as high, however
        // the other tests of this binary allocate in between.
        let rss = proc_status_mib("VmRSS:").unwrap();
        let hwm = proc_status_mib("VmHWM:").unwrap();
        assert!(hwm > 0.0 && rss > 0.0 && hwm >= rss * 0.99, "{hwm} {rss}");
    }
}
