//! The latencies: from a producer's commit to the transport, with the relay in the same
//! process or in a second one (`relay-child`, PostgreSQL only).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agentsaga_core::{Envelope, Message, Store};
use agentsaga_relay::{Delivery, Relay, Transport};
use anyhow::{Context, ensure};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::setup::{ChildArgs, GRACE, RATE, Sizes, relay_config};
use crate::outbox::{self, DEST};
use crate::report::percentile;

/// Wall-clock nanoseconds since the Unix epoch: comparable across processes.
fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}

/// A latency message's payload.
#[derive(Debug, Serialize, Deserialize)]
struct Probe {
    /// Its number, 0-based.
    n: usize,
    /// The producer's wall clock before its INSERT, ns.
    t_ns: u64,
}

/// A transport noting when each probe arrives (the first time, if redelivered).
struct Recorder {
    /// Arrival per probe, ns; 0 = not yet.
    arrived: Vec<AtomicU64>,
    /// The probe's own `t_ns`.
    sent: Vec<AtomicU64>,
    count: AtomicUsize,
    strays: AtomicUsize,
}

impl Recorder {
    fn new(n: usize) -> Self {
        Self {
            arrived: (0..n).map(|_| AtomicU64::new(0)).collect(),
            sent: (0..n).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicUsize::new(0),
            strays: AtomicUsize::new(0),
        }
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    fn arrivals(&self) -> Vec<u64> {
        self.arrived
            .iter()
            .map(|a| a.load(Ordering::Acquire))
            .collect()
    }

    fn sent(&self) -> Vec<u64> {
        self.sent
            .iter()
            .map(|a| a.load(Ordering::Acquire))
            .collect()
    }

    /// Waits until every probe arrived, or `patience` ran out.
    async fn wait_all(&self, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        while self.count() < self.arrived.len() {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }
}

#[async_trait::async_trait]
impl Transport for Recorder {
    async fn deliver(&self, envelope: &Envelope) -> Delivery {
        let now = unix_ns();
        match serde_json::from_str::<Probe>(&envelope.payload) {
            Ok(p) if p.n < self.arrived.len() => {
                if self.arrived[p.n]
                    .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    self.sent[p.n].store(p.t_ns, Ordering::Release);
                    self.count.fetch_add(1, Ordering::AcqRel);
                }
            }
            _ => {
                self.strays.fetch_add(1, Ordering::Relaxed);
            }
        }
        Delivery::Delivered
    }
}

/// What the producer did.
struct Produced {
    /// Wall clock right after each commit() returned, ns.
    committed: Vec<u64>,
    /// How long each commit() took, ns.
    commit_ns: Vec<u64>,
    /// Messages per second actually offered.
    rate: f64,
}

/// One message per transaction, message `i` due at `i / RATE` s after the start.
async fn produce(store: &Store, count: usize) -> anyhow::Result<Produced> {
    let mut committed = Vec::with_capacity(count);
    let mut commit_ns = Vec::with_capacity(count);
    let start = tokio::time::Instant::now();
    for i in 0..count {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / RATE)).await;
        let probe = Probe {
            n: i,
            t_ns: unix_ns(),
        };
        let mut tx = store.begin().await?;
        tx.enqueue(&Message::to(DEST).key(outbox::key(i)).json(&probe)?)
            .await?;
        let before = unix_ns();
        tx.commit().await?;
        let after = unix_ns();
        committed.push(after);
        commit_ns.push(after.saturating_sub(before));
    }
    Ok(Produced {
        committed,
        commit_ns,
        rate: count as f64 / start.elapsed().as_secs_f64(),
    })
}

/// Percentiles of a set of latencies.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Summary {
    /// Latencies measured.
    count: usize,
    /// Messages that never arrived.
    missing: usize,
    /// Arrivals seen before the base time (counted as 0).
    early: usize,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    max_ms: f64,
    mean_ms: f64,
}

impl Summary {
    /// Latencies `arrived[i] - base[i]`; a 0 in `arrived` is a message that never
    /// arrived.
    fn of(arrived: &[u64], base: &[u64]) -> Self {
        let mut missing = 0;
        let mut early = 0;
        let mut ms: Vec<f64> = Vec::with_capacity(arrived.len());
        for (&a, &b) in arrived.iter().zip(base) {
            if a == 0 {
                missing += 1;
                continue;
            }
            if a < b {
                early += 1;
            }
            ms.push(a.saturating_sub(b) as f64 / 1e6);
        }
        ms.sort_by(f64::total_cmp);
        let mean = if ms.is_empty() {
            0.0
        } else {
            ms.iter().sum::<f64>() / ms.len() as f64
        };
        Self {
            count: ms.len(),
            missing,
            early,
            p50_ms: percentile(&ms, 50.0),
            p99_ms: percentile(&ms, 99.0),
            max_ms: ms.last().copied().unwrap_or_default(),
            mean_ms: mean,
        }
    }

    fn describe(&self) -> String {
        format!(
            "p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms, mean {:.2} ms over {}{}{}",
            self.p50_ms,
            self.p99_ms,
            self.max_ms,
            self.mean_ms,
            self.count,
            if self.missing > 0 {
                format!(", {} MISSING", self.missing)
            } else {
                String::new()
            },
            if self.early > 0 {
                format!(", {} before commit() returned", self.early)
            } else {
                String::new()
            }
        )
    }
}

/// One latency run's results.
pub(super) struct LatencyRun {
    /// Arrival − the producer's clock after commit(): the figure.
    pub(super) after_commit: Summary,
    /// Arrival − the probe's `t_ns` (before the INSERT): includes insert and commit.
    before_insert: Summary,
    /// commit() durations.
    commit: Summary,
    /// The producer's achieved rate.
    offered: f64,
    /// The relay's own histogram (enqueue row time → outcome, ms buckets).
    relay: Option<(Option<u64>, Option<u64>)>,
}

impl LatencyRun {
    fn new(produced: &Produced, arrived: &[u64], before_insert: Summary) -> Self {
        let zeros = vec![0u64; produced.commit_ns.len()];
        Self {
            after_commit: Summary::of(arrived, &produced.committed),
            before_insert,
            commit: Summary::of(&produced.commit_ns, &zeros),
            offered: produced.rate,
            relay: None,
        }
    }

    pub(super) fn describe(&self, what: &str) -> String {
        let relay = match self.relay {
            Some((p50, p99)) => format!(
                "; the relay's own counters (row created_at -> outcome, 25 % buckets): p50 \
                 {} ms, p99 {} ms",
                p50.map_or("-".into(), |v| v.to_string()),
                p99.map_or("-".into(), |v| v.to_string())
            ),
            None => String::new(),
        };
        format!(
            "{what}: offered {:.0} msgs/s; after commit: {}; from before the INSERT: p50 \
             {:.2} ms, p99 {:.2} ms; commit() itself: p50 {:.2} ms, p99 {:.2} ms{relay}",
            self.offered,
            self.after_commit.describe(),
            self.before_insert.p50_ms,
            self.before_insert.p99_ms,
            self.commit.p50_ms,
            self.commit.p99_ms,
        )
    }
}

/// Producer and relay in this process.
pub(super) async fn in_process(
    url: &str,
    count: usize,
    workers: usize,
) -> anyhow::Result<LatencyRun> {
    let store = Store::connect(url).await?;
    let recorder = Arc::new(Recorder::new(count));
    let relay = Relay::start(
        store.clone(),
        vec![DEST.to_owned()],
        Arc::clone(&recorder) as Arc<dyn Transport>,
        relay_config(workers),
    )
    .await?;
    // Let the relay take its first (empty) poll before the clock starts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let produced = produce(&store, count).await?;
    let all = recorder.wait_all(GRACE).await;
    let stats = relay.stats();
    relay.shutdown().await;
    store.close().await;
    ensure!(
        all,
        "{} of {count} messages arrived within {GRACE:?}",
        recorder.count()
    );
    let arrived = recorder.arrivals();
    let from_payload = Summary::of(&arrived, &recorder.sent());
    let mut run = LatencyRun::new(&produced, &arrived, from_payload);
    run.relay = Some((stats.latency_p50_ms, stats.latency_p99_ms));
    eprintln!("{}", run.describe("in-process"));
    Ok(run)
}

/// What `relay-child` prints on stdout when done: one JSON object on one line.
#[derive(Debug, Serialize, Deserialize)]
struct ChildReport {
    /// Arrival per probe, ns (0 = never arrived).
    arrived: Vec<u64>,
    /// Latencies from the probes' own `t_ns` (before the INSERT), as the child sees
    /// them.
    from_payload: Summary,
    /// The relay's own latency percentiles (ms).
    relay_p50_ms: Option<u64>,
    relay_p99_ms: Option<u64>,
    /// Database errors the relay met.
    db_errors: u64,
    /// Payloads that were not probes.
    strays: usize,
}

/// The line `relay-child` prints once its relay runs.
const READY: &str = "relay-child ready";

/// Producer here, relay in a child process.
pub(super) async fn cross_process(
    url: &str,
    sizes: Sizes,
    workers: usize,
) -> anyhow::Result<LatencyRun> {
    let count = sizes.messages();
    let exe = std::env::current_exe().context("finding this executable")?;
    // The database exists and is migrated before the child connects.
    let store = Store::connect(url).await?;
    let mut child = tokio::process::Command::new(exe)
        .arg("relay-child")
        .arg("--url")
        .arg(url)
        .arg("--count")
        .arg(count.to_string())
        .arg("--seconds")
        .arg(sizes.latency_secs.to_string())
        .arg("--workers")
        .arg(workers.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting relay-child")?;
    let stdout = child.stdout.take().context("no stdout from relay-child")?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .context("relay-child did not start within 60 s")??;
    ensure!(
        ready.as_deref() == Some(READY),
        "relay-child said {ready:?} instead of {READY:?}"
    );
    let produced = produce(&store, count).await?;
    let patience = GRACE + Duration::from_secs(30);
    let line = tokio::time::timeout(patience, lines.next_line())
        .await
        .context("relay-child did not report in time")??
        .context("relay-child ended without a report")?;
    let status = child.wait().await?;
    store.close().await;
    ensure!(status.success(), "relay-child failed: {status}");
    let report: ChildReport =
        serde_json::from_str(&line).context("relay-child's report is not JSON")?;
    ensure!(
        report.arrived.len() == count,
        "relay-child reported {} arrivals for {count} messages",
        report.arrived.len()
    );
    let mut run = LatencyRun::new(&produced, &report.arrived, report.from_payload);
    run.relay = Some((report.relay_p50_ms, report.relay_p99_ms));
    ensure!(
        report.db_errors == 0 && report.strays == 0,
        "relay-child saw {} database errors and {} unexpected messages",
        report.db_errors,
        report.strays
    );
    ensure!(
        run.after_commit.missing == 0,
        "{} messages never reached relay-child",
        run.after_commit.missing
    );
    eprintln!("{}", run.describe("cross-process"));
    Ok(run)
}

/// `relay-child`: runs a relay with a [`Recorder`] against `--url` until `--count`
/// probes arrived (or the producer's time plus [`GRACE`] ran out), then prints a
/// [`ChildReport`] on stdout.
pub(crate) async fn child(args: &ChildArgs) -> anyhow::Result<()> {
    use std::io::Write as _;
    let store = Store::connect(&args.url).await?;
    let recorder = Arc::new(Recorder::new(args.count));
    let relay = Relay::start(
        store.clone(),
        vec![DEST.to_owned()],
        Arc::clone(&recorder) as Arc<dyn Transport>,
        relay_config(args.workers.max(1)),
    )
    .await?;
    // The store's LISTEN connection is set up by a task of its own: give it time.
    tokio::time::sleep(Duration::from_millis(500)).await;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{READY}")?;
        out.flush()?;
    }
    let patience = Duration::from_secs_f64(args.seconds.max(0.0)) + GRACE;
    let all = recorder.wait_all(patience).await;
    if !all {
        eprintln!(
            "relay-child: {} of {} messages arrived",
            recorder.count(),
            args.count
        );
    }
    let stats = relay.stats();
    relay.shutdown().await;
    store.close().await;
    let arrived = recorder.arrivals();
    let report = ChildReport {
        from_payload: Summary::of(&arrived, &recorder.sent()),
        arrived,
        relay_p50_ms: stats.latency_p50_ms,
        relay_p99_ms: stats.latency_p99_ms,
        db_errors: stats.db_errors,
        strays: recorder.strays.load(Ordering::Relaxed),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&report)?)?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_count_missing_and_early() {
        let s = Summary::of(&[0, 2_000_000, 5_000_000, 1], &[0, 1_000_000, 1_000_000, 9]);
        assert_eq!(s.missing, 1);
        assert_eq!(s.early, 1);
        assert_eq!(s.count, 3);
        assert_eq!(s.max_ms, 4.0);
        assert_eq!(s.p50_ms, 1.0);
    }
}
