//! The saga bench's `sleeps` shape (issue 48): sleeping sagas cost rows, not memory,
//! and many wake-ups due at once fire on time without starving live work.
//!
//! - **Asleep** (`sleeps-child`, a fresh process per backend so that its RSS is its
//!   own): a runtime runs [`WARM_UP`] sagas of the bench's happy shape, then its RSS
//!   is read (`rss_none_asleep`); then it starts `N` sagas that sleep an hour (the
//!   saga `napper`: `Step::sleep`, then a step to `agent_a`), waits until all `N` are
//!   parked, lets the relay poll for [`SETTLE`], and reads its RSS again
//!   (`rss_asleep_n{N}`, against the first as floor).
//! - **Due at once**: a runtime on a fresh database starts [`DUE`] sagas whose
//!   `Step::sleep_until` times are spread over one second a few seconds ahead, then
//!   runs the happy shape ([`HAPPY`] sagas, the bench's window and pacing) across that
//!   second: `due_happy_rate` against the same runtime's happy rate with nothing due
//!   (run first, on the same database). Once every sleeper is done, each wake-up's
//!   lateness is its step's reply time minus its due time: `due_lateness_p50`, `_p99`.

use std::time::{Duration, Instant, SystemTime};

use agentsaga_core::{ReadPool, Sql};
use agentsaga_runtime::Runtime;
use agentsaga_saga::{Saga, SagaDefinition, Step};
use anyhow::{Context, bail, ensure};
use serde::{Deserialize, Serialize};

use super::drive::{Driven, drive};
use super::runtime_side::{Data, agent, definition, store_config};
use super::setup::{BENCH, SAGA, STEPS};
use crate::db::{Backend, Scratch};
use crate::report::{Figure, percentile};

const NAPPER: &str = "napper";
/// Happy sagas before the first RSS reading (so that pools and caches exist).
const WARM_UP: usize = 2_000;
/// How long the asleep process idles before its second reading.
const SETTLE: Duration = Duration::from_secs(3);
/// Wake-ups due within one second, and the happy sagas run across it.
const DUE: usize = 10_000;
const HAPPY: usize = 4_000;
/// Sagas started per transaction.
const CHUNK: usize = 500;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Nap {
    /// When to wake, Unix ms (0: the definition's hour).
    at: u64,
}

/// `napper`: a sleep (an hour, or until the data's `at`), then a step to `agent_a`.
fn napper(until: bool) -> anyhow::Result<SagaDefinition> {
    let sleep = if until {
        Step::sleep_until("nap", |n: &Nap| {
            SystemTime::UNIX_EPOCH + Duration::from_millis(n.at)
        })
    } else {
        Step::sleep("nap", Duration::from_secs(3600))
    };
    Ok(Saga::<Nap>::builder(NAPPER, 1)
        .step(sleep)
        .pivot(Step::new("after", STEPS[0].1))
        .build()?)
}

/// A runtime with the bench's saga and agents, and `napper`, with no admission bound
/// for it (sleepers hold no slot of anything: the bound would only queue them).
async fn runtime(url: &str, until: bool) -> anyhow::Result<Runtime> {
    let mut builder = Runtime::builder()
        .database(url)
        .store_config(store_config())
        .saga(definition()?)
        .saga(napper(until)?)
        .max_in_flight_for(NAPPER, None);
    for (_, destination) in STEPS {
        builder = builder.agent(agent(destination));
    }
    Ok(builder.start().await?)
}

async fn count(reader: ReadPool<'_>, sql: &'static str, name: &str) -> anyhow::Result<usize> {
    let row = Sql::new(sql).bind(name).fetch_one(reader).await?;
    Ok(usize::try_from(row.int("n")?)?)
}

/// Runs `n` happy sagas of the bench's shape through `rt`, its window and pacing;
/// `base` of them already done.
async fn happy(rt: &Runtime, n: usize, base: u64) -> anyhow::Result<Driven> {
    let store = rt.store().clone();
    drive(
        n,
        |first, count| async move {
            let data: Vec<Data> = (first..first + count)
                .map(|i| Data {
                    n: base + i as u64,
                    fail: false,
                })
                .collect();
            let mut tx = rt.store().begin().await?;
            rt.start_sagas_in(&mut tx, SAGA, &data).await?;
            tx.commit().await?;
            Ok(())
        },
        |started| {
            let store = store.clone();
            async move {
                let done = count(
                    store.reader(),
                    "SELECT count(*) AS n FROM saga_instances WHERE name = ? AND state = 'completed'",
                    SAGA,
                )
                .await?;
                Ok(started.saturating_sub(done.saturating_sub(base as usize)))
            }
        },
    )
    .await
}

async fn start_nappers(rt: &Runtime, n: usize, at: impl Fn(usize) -> u64) -> anyhow::Result<()> {
    for first in (0..n).step_by(CHUNK) {
        let data: Vec<Nap> = (first..(first + CHUNK).min(n))
            .map(|i| Nap { at: at(i) })
            .collect();
        let mut tx = rt.store().begin().await?;
        rt.start_sagas_in(&mut tx, NAPPER, &data).await?;
        tx.commit().await?;
    }
    Ok(())
}

const ASLEEP_SQL: &str =
    "SELECT count(*) AS n FROM saga_steps s JOIN saga_instances i ON i.id = s.saga_id
     WHERE i.name = ? AND s.state = 'dispatched' AND s.destination LIKE 'sleep:%'";

/// The hidden `sleeps-child` subcommand: the asleep measurement, as one JSON line.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ChildArgs {
    /// The (fresh) database.
    #[arg(long)]
    url: String,
    /// Sagas asleep.
    #[arg(long)]
    asleep: usize,
}

#[derive(Debug, Serialize, Deserialize)]
struct Asleep {
    rss_none_mib: f64,
    rss_asleep_mib: f64,
}

pub(crate) async fn child(args: &ChildArgs) -> anyhow::Result<()> {
    let rt = runtime(&args.url, false).await?;
    happy(&rt, WARM_UP, 0).await?;
    tokio::time::sleep(SETTLE).await;
    let rss_none_mib = crate::scale::rss_mib().context("reading VmRSS")?;
    start_nappers(&rt, args.asleep, |_| 0).await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while count(rt.store().reader(), ASLEEP_SQL, NAPPER).await? < args.asleep {
        ensure!(
            Instant::now() < deadline,
            "the sleepers did not all park in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(SETTLE).await;
    let rss_asleep_mib = crate::scale::rss_mib().context("reading VmRSS")?;
    rt.shutdown().await;
    println!(
        "{}",
        serde_json::to_string(&Asleep {
            rss_none_mib,
            rss_asleep_mib
        })?
    );
    Ok(())
}

/// The `sleeps` shape's figures and notes on `backend`.
pub(super) async fn figures(
    backend: Backend,
    quick: bool,
    scratch: &mut Scratch,
) -> anyhow::Result<(Vec<Figure>, Vec<String>)> {
    let name = backend.name();
    let asleep = if quick { 5_000 } else { 100_000 };
    let (due, happy_n) = if quick { (1_000, 1_000) } else { (DUE, HAPPY) };
    let mut figures = Vec::new();

    // Asleep, in a process of its own.
    let url = scratch.fresh_url(backend).await?;
    let out = tokio::process::Command::new(std::env::current_exe()?)
        .args([
            "sleeps-child",
            "--url",
            &url,
            "--asleep",
            &asleep.to_string(),
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .await?;
    if !out.status.success() {
        bail!("sleeps-child failed: {}", out.status);
    }
    let a: Asleep = serde_json::from_slice(&out.stdout).context("sleeps-child's line")?;
    figures.push(
        Figure::new(
            BENCH,
            name,
            crate::scale::metric("rss_asleep", asleep),
            a.rss_asleep_mib,
            "MiB",
        )
        .with_floor(a.rss_none_mib),
    );

    // Due at once, against the same runtime's happy rate with nothing due.
    let url = scratch.fresh_url(backend).await?;
    let rt = runtime(&url, true).await?;
    let quiet = happy(&rt, happy_n, 0).await?;
    let lead = Duration::from_secs(if quick { 3 } else { 6 });
    let t0 = agentsaga_core::clock::system_now_ms() + i64::try_from(lead.as_millis())?;
    let started = Instant::now();
    let spread = |i: usize| (t0 + (i as i64 * 1000) / due as i64) as u64;
    start_nappers(&rt, due, spread).await?;
    let took = started.elapsed();
    ensure!(
        took + Duration::from_millis(500) < lead,
        "{due} starts took {took:?}, past the lead of {lead:?}"
    );
    // The happy run starts half a second before the first is due and spans the second.
    tokio::time::sleep_until((started + lead - Duration::from_millis(500)).into()).await;
    let busy = happy(&rt, happy_n, happy_n as u64).await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while count(
        rt.store().reader(),
        "SELECT count(*) AS n FROM saga_instances WHERE name = ? AND state = 'completed'",
        NAPPER,
    )
    .await?
        < due
    {
        ensure!(
            Instant::now() < deadline,
            "the sleepers did not all finish in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows = Sql::new(
        "SELECT {ms s.replied_at} - {ms s.deadline} AS late FROM saga_steps s
         JOIN saga_instances i ON i.id = s.saga_id
         WHERE i.name = ? AND s.destination LIKE 'sleep:%'",
    )
    .bind(NAPPER)
    .fetch_all(rt.store().reader())
    .await?;
    rt.shutdown().await;
    let mut late: Vec<f64> = rows
        .iter()
        .map(|r| r.int("late").map(|l| l as f64))
        .collect::<Result<_, _>>()?;
    late.sort_by(f64::total_cmp);
    ensure!(late.len() == due, "{} of {due} wake-ups found", late.len());
    let early = late.iter().filter(|&&l| l < 0.0).count();
    for (metric, p) in [("due_lateness_p50", 50.0), ("due_lateness_p99", 99.0)] {
        figures.push(Figure::new(BENCH, name, metric, percentile(&late, p), "ms"));
    }
    figures.push(
        Figure::new(BENCH, name, "due_happy_rate", busy.rate(happy_n), "sagas/s")
            .with_floor(quiet.rate(happy_n)),
    );
    let notes = vec![format!(
        "{name} sleeps: {asleep} sagas asleep in a process of their own (after {WARM_UP} happy \
         sagas; RSS read {SETTLE:?} after the last parked) against the same process before \
         they started; {due} wake-ups due within one second, {} s ahead, started in {took:?}, \
         while {happy_n} happy sagas ran across that second (floor: {happy_n} before, same \
         runtime and database, nothing due); lateness = the sleep step's reply time - its \
         due time (ms clock; {early} woke early by the clock's rounding)",
        lead.as_secs()
    )];
    Ok((figures, notes))
}
