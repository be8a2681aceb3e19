//! The `relay` bench: how fast [`agentsaga_relay::Relay`] drains the outbox, and how
//! soon a committed message reaches its transport.
//!
//! - `drain_rate`: a keyed backlog (the outbox bench's: 1000 keys round-robin) drained
//!   by a relay (`batch_size(100)`, `workers(8)`) to a no-op transport, from its start
//!   until its counters say every row is marked delivered; floor: one plain-sqlx loop
//!   claiming 100 rows (`UPDATE … RETURNING`, **with** the store's per-key
//!   `NOT EXISTS` check, so the same work) and marking them delivered in one `UPDATE`.
//! - `latency_p50_in_process` / `latency_p99_in_process`: a producer task enqueues one
//!   message per transaction at 1,000 msgs/s (`store.begin()`, `tx.enqueue`,
//!   `tx.commit()`, which wakes the relay) while a relay in the same process delivers
//!   them to a transport that notes the time of arrival. Latency = arrival − the
//!   producer's clock right after its `commit()` returned.
//! - `latency_p50_cross_process` / `latency_p99_cross_process` (PostgreSQL only): the
//!   same, with the relay in a second process (this binary re-executed as the hidden
//!   `relay-child` subcommand) woken by the store's debounced NOTIFY. The child prints
//!   its arrivals as one JSON object; the parent joins them with its commit times (the
//!   same machine, the same wall clock).
//!
//! No floor exists for the latencies: they are checked against the targets.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agentsaga_core::{Envelope, Message, Store};
use agentsaga_relay::{Delivery, Relay, RelayConfig, Transport};
use anyhow::{Context, bail, ensure};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::Common;
use crate::db::{Backend, Scratch};
use crate::outbox::{self, BATCH, DEST};
use crate::report::{Figure, Report, Target};

const BENCH: &str = "relay";
/// Offered load of the latency runs, msgs/s.
const RATE: f64 = 1000.0;
/// The relay's fallback poll period (its default): wakeups should make it moot.
const POLL: Duration = Duration::from_millis(250);
/// Targets from the issue.
const DRAIN_RATIO: f64 = 0.6;
const P50_IN_PROCESS_MS: f64 = 3.0;
const P99_IN_PROCESS_MS: f64 = 20.0;
const P99_CROSS_PROCESS_MS: f64 = 50.0;
/// How long deliveries may trail the producer before the run is called failed.
const GRACE: Duration = Duration::from_secs(60);

/// `relay` options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: Common,
    /// Delivery workers of the relays measured (the configuration: 8). A relay
    /// keeps up to workers + batch size rows in flight.
    #[arg(long, default_value_t = 8)]
    workers: usize,
}

/// The hidden `relay-child` subcommand: a relay alone against `url`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ChildArgs {
    /// The PostgreSQL database the parent produces into.
    #[arg(long)]
    url: String,
    /// How many messages the parent sends.
    #[arg(long)]
    count: usize,
    /// How long the parent produces, in seconds (the child gives up [`GRACE`] later).
    #[arg(long)]
    seconds: f64,
    /// Delivery workers.
    #[arg(long, default_value_t = 8)]
    workers: usize,
}

/// How much work each figure does.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Backlog rows drained per round.
    backlog: usize,
    /// Drain rounds per side (the median is reported).
    rounds: usize,
    /// Seconds of production at [`RATE`] per latency run.
    latency_secs: f64,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                backlog: 10_000,
                rounds: 1,
                latency_secs: 3.0,
            }
        } else {
            Self {
                backlog: 100_000,
                rounds: 2,
                latency_secs: 10.0,
            }
        }
    }

    fn messages(self) -> usize {
        (self.latency_secs * RATE) as usize
    }
}

fn relay_config(workers: usize) -> RelayConfig {
    RelayConfig::default()
        .batch_size(BATCH as u32)
        .workers(workers)
        .poll_interval(POLL)
}

/// Runs the `relay` bench on the chosen backends.
pub(crate) async fn run(args: &Args, scratch: &mut Scratch) -> anyhow::Result<Report> {
    ensure!(args.workers > 0, "--workers must be at least 1");
    let sizes = Sizes::new(args.common.quick);
    let started = Instant::now();
    let mut report = Report::default();
    let mut latency_notes = Vec::new();
    for backend in args.common.backend.backends() {
        let name = backend.name();
        report.notes.push(scratch.describe(backend).await?);

        let (value, floor) = drain(backend, sizes, args.workers, scratch)
            .await
            .with_context(|| format!("{name} drain_rate"))?;
        report.figures.push(
            Figure::new(BENCH, name, "drain_rate", value, "msgs/s")
                .with_floor(floor)
                .target(Target::Ratio(DRAIN_RATIO)),
        );

        let url = scratch.fresh_url(backend).await?;
        let run = in_process(&url, sizes.messages(), args.workers)
            .await
            .with_context(|| format!("{name} in-process latency"))?;
        report.figures.extend([
            Figure::new(
                BENCH,
                name,
                "latency_p50_in_process",
                run.after_commit.p50_ms,
                "ms",
            )
            .target(Target::AtMost(P50_IN_PROCESS_MS)),
            Figure::new(
                BENCH,
                name,
                "latency_p99_in_process",
                run.after_commit.p99_ms,
                "ms",
            )
            .target(Target::AtMost(P99_IN_PROCESS_MS)),
        ]);
        latency_notes.push(run.describe(&format!("{name} in-process")));

        if backend == Backend::Postgres {
            let url = scratch.fresh_url(backend).await?;
            let run = cross_process(&url, sizes, args.workers)
                .await
                .context("postgres cross-process latency")?;
            report.figures.extend([
                Figure::new(
                    BENCH,
                    name,
                    "latency_p50_cross_process",
                    run.after_commit.p50_ms,
                    "ms",
                ),
                Figure::new(
                    BENCH,
                    name,
                    "latency_p99_cross_process",
                    run.after_commit.p99_ms,
                    "ms",
                )
                .target(Target::AtMost(P99_CROSS_PROCESS_MS)),
            ]);
            latency_notes.push(run.describe("postgres cross-process"));
        }
    }
    let rounds = if sizes.rounds == 1 {
        "one round (--quick: a smoke run, not a measurement)".to_owned()
    } else {
        format!(
            "median of {} rounds per side, relay and floor alternating which runs first",
            sizes.rounds
        )
    };
    report.notes.extend([
        format!(
            "drain: a backlog of {} rows over {} keys round-robin, filled untimed in a \
             template database, each drain on a fresh copy; {rounds}. The relay \
             (batch_size {BATCH}, workers {}, poll {} ms) delivers to a no-op transport, \
             timed from Relay::start until its `delivered` counter (acks written) reaches \
             the backlog; it keeps up to {} rows in flight (workers + batch). \
             The floor is one plain-sqlx loop: claim {BATCH} with the store's per-key NOT \
             EXISTS check (the same work, unlike the outbox bench's floor), mark them \
             delivered, repeat",
            sizes.backlog,
            outbox::KEYS,
            args.workers,
            POLL.as_millis(),
            args.workers + BATCH,
        ),
        format!(
            "latency: one producer task, one message per transaction, {RATE} msgs/s for \
             {} s ({} messages, keys round-robin over {}); latency = arrival at the \
             transport - the producer's wall clock right after commit() returned (negative \
             values, a delivery seen before commit() returned, count as 0); exact \
             percentiles (nearest rank). Cross-process: this binary re-executed as \
             `relay-child`, woken by the store's debounced NOTIFY, same wall clock",
            sizes.latency_secs,
            sizes.messages(),
            outbox::KEYS,
        ),
    ]);
    report.notes.extend(latency_notes);
    report.notes.push(format!(
        "whole run: {:.1} s; ratio = value / floor; targets: drain ratio >= {DRAIN_RATIO}, \
         in-process p50 <= {P50_IN_PROCESS_MS} ms and p99 <= {P99_IN_PROCESS_MS} ms, \
         cross-process p99 <= {P99_CROSS_PROCESS_MS} ms",
        started.elapsed().as_secs_f64()
    ));
    Ok(report)
}

// ----- drain_rate ----------------------------------------------------------------------

/// (relay median, floor median), msgs/s.
async fn drain(
    backend: Backend,
    sizes: Sizes,
    workers: usize,
    scratch: &mut Scratch,
) -> anyhow::Result<(f64, f64)> {
    let template = scratch.fresh_url(backend).await?;
    outbox::fill(&template, sizes.backlog).await?;
    outbox::settle(backend, &template).await?;
    let (mut relay_rates, mut floor_rates) = (Vec::new(), Vec::new());
    for round in 0..sizes.rounds {
        let relay_first = round % 2 == 1;
        for relay_side in [relay_first, !relay_first] {
            let url = scratch.copy_of(backend, &template).await?;
            let rate = if relay_side {
                relay_drain(&url, sizes.backlog, workers).await?
            } else {
                outbox::floor_drain_with(backend, &url, sizes.backlog, SQLITE_CLAIM, PG_CLAIM)
                    .await?
            };
            let side = if relay_side { "relay" } else { "floor" };
            eprintln!(
                "{:<8} {:<22} round {}/{}  {side:<5} {rate:>10.0} msgs/s",
                backend.name(),
                "drain_rate",
                round + 1,
                sizes.rounds,
            );
            if relay_side {
                relay_rates.push(rate);
            } else {
                floor_rates.push(rate);
            }
        }
    }
    Ok((outbox::median(relay_rates), outbox::median(floor_rates)))
}

/// Delivers everything, at once.
struct NoOp;

#[async_trait::async_trait]
impl Transport for NoOp {
    async fn deliver(&self, _envelope: &Envelope) -> Delivery {
        Delivery::Delivered
    }
}

async fn relay_drain(url: &str, backlog: usize, workers: usize) -> anyhow::Result<f64> {
    let store = Store::connect(url).await?;
    let start = Instant::now();
    let relay = Relay::start(
        store.clone(),
        vec![DEST.to_owned()],
        Arc::new(NoOp),
        relay_config(workers),
    )
    .await?;
    let deadline = start + Duration::from_secs(900);
    let stats = loop {
        let stats = relay.stats();
        if stats.delivered >= backlog as u64 {
            break stats;
        }
        if Instant::now() > deadline {
            bail!(
                "the relay delivered {} of {backlog} rows in 15 minutes",
                stats.delivered
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let elapsed = start.elapsed();
    relay.shutdown().await;
    store.close().await;
    ensure!(
        stats.delivered == backlog as u64 && stats.dead == 0 && stats.retried == 0,
        "the relay drained badly: {stats:?}"
    );
    Ok(backlog as f64 / elapsed.as_secs_f64())
}

/// The store's claim (`crates/core/src/store/sqlite.rs`) for one destination, with the
/// outbox floor's parameters and columns.
const SQLITE_CLAIM: &str = "UPDATE outbox
     SET state = 'in_flight', lease_owner = ?1, lease_until = ?2, attempts = attempts + 1
     WHERE seq IN (
         SELECT o.seq FROM outbox o
         WHERE o.state = 'pending' AND o.available_at <= ?3 AND o.destination = ?4
           AND (o.key IS NULL OR (
               NOT EXISTS (SELECT 1 FROM outbox p
                   WHERE p.key = o.key AND p.seq < o.seq
                     AND p.key IS NOT NULL AND p.state IN ('pending', 'in_flight'))
               AND NOT EXISTS (SELECT 1 FROM outbox f
                   WHERE f.key = o.key AND f.key IS NOT NULL AND f.state = 'in_flight')))
         ORDER BY o.seq
         LIMIT ?5)
     RETURNING seq, id, destination, key, payload, headers, attempts, created_at";

/// The store's claim (`crates/core/src/store/postgres.rs`) for one destination.
const PG_CLAIM: &str = "UPDATE outbox o
     SET state = 'in_flight', lease_owner = $1,
         lease_until = now() + $2 * interval '1 millisecond', attempts = o.attempts + 1
     WHERE o.seq IN (
         SELECT c.seq FROM outbox c
         WHERE c.state = 'pending' AND c.available_at <= now() AND c.destination = $3
           AND (c.key IS NULL OR (
                   NOT EXISTS (SELECT 1 FROM outbox p
                       WHERE p.key = c.key AND p.seq < c.seq
                         AND p.key IS NOT NULL AND p.state IN ('pending', 'in_flight'))
                   AND NOT EXISTS (SELECT 1 FROM outbox f
                       WHERE f.key = c.key AND f.key IS NOT NULL AND f.state = 'in_flight')))
         ORDER BY c.seq
         LIMIT $4
         FOR UPDATE SKIP LOCKED)
     RETURNING o.seq, o.id, o.destination, o.key, o.payload::text, o.headers::text,
         o.attempts, (extract(epoch FROM o.created_at) * 1000)::bigint";

// ----- latency -------------------------------------------------------------------------

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
struct Summary {
    /// Latencies measured.
    count: usize,
    /// Messages that never arrived.
    missing: usize,
    /// Arrivals seen before the base time (counted as 0).
    early: usize,
    p50_ms: f64,
    p99_ms: f64,
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

/// Nearest-rank percentile of sorted values.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One latency run's results.
struct LatencyRun {
    /// Arrival − the producer's clock after commit(): the figure.
    after_commit: Summary,
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

    fn describe(&self, what: &str) -> String {
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
async fn in_process(url: &str, count: usize, workers: usize) -> anyhow::Result<LatencyRun> {
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
async fn cross_process(url: &str, sizes: Sizes, workers: usize) -> anyhow::Result<LatencyRun> {
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
    fn nearest_rank_percentiles() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 50.0), 50.0);
        assert_eq!(percentile(&xs, 99.0), 99.0);
        assert_eq!(percentile(&xs, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

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
