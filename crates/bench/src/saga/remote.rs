//! `saga --transport nats`: the same sagas with their agents in another service, a
//! second process with its own SQLite database, linked by a NATS JetStream server
//! (a throwaway `nats-server -js` per run): every command and reply goes out through
//! one service's outbox, across the broker, into the other's outbox, as
//! `docs/remote.md` describes. Figures: sagas/s and latency over NATS, each against
//! the same figure of the runtime with its agents in-process (the "floor"), the two
//! run in alternation.
//!
//! The agents' process is this binary re-executed as the hidden `saga-agents-child`
//! subcommand ([`child`]): it starts a runtime with the three agents and
//! `remote_saga`, says `ready` on stdout, and stops when its stdin closes.

use std::process::Stdio;
use std::time::Duration;

use agentsaga_core::testing::NatsServer;
use agentsaga_relay::RelayConfig;
use agentsaga_runtime::{NatsLink, Runtime};
use anyhow::{Context, bail, ensure};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use super::drive::Run;
use super::runtime_side::{agent, definition, measure, runtime_run, store_config};
use super::setup::{SAGA, STEPS, Scenario, Sizes};
use crate::db::{Backend, Scratch};
use crate::report::percentile;

/// This service's name at the broker (the orchestrator's).
const ORCHESTRATOR_SERVICE: &str = "bench_orchestrator";
/// The agents' service name at the broker.
const AGENTS_SERVICE: &str = "bench_agents";
/// How long the agents' process may take to say it is ready, or to stop.
const PATIENCE: Duration = Duration::from_secs(60);

/// The hidden `saga-agents-child` subcommand: the bench saga's three agents in a
/// service of their own.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ChildArgs {
    /// The NATS server (`nats://127.0.0.1:…`).
    #[arg(long)]
    nats: String,
    /// The agents' own database (SQLite).
    #[arg(long)]
    database: String,
    /// Relay workers (the agents' service's local relay).
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// SQLite `synchronous = FULL` (the parent's `--sqlite-synchronous full`).
    #[arg(long)]
    full_sync: bool,
}

/// The agents' process: runs until its stdin closes.
pub(crate) async fn child(args: &ChildArgs) -> anyhow::Result<()> {
    crate::db::SQLITE_FULL_SYNC.store(args.full_sync, std::sync::atomic::Ordering::Relaxed);
    let link = NatsLink::connect(&args.nats, AGENTS_SERVICE).await?;
    let mut builder = Runtime::builder()
        .database(&args.database)
        .store_config(store_config())
        .relay_config(RelayConfig::default().workers(args.workers))
        .remote_saga(SAGA, 1, &link);
    for (_, destination) in STEPS {
        builder = builder.agent(agent(destination));
    }
    let runtime = builder.start().await?;
    println!("ready");
    // Until the parent closes our stdin (or dies).
    let mut sink = Vec::new();
    tokio::io::stdin().read_to_end(&mut sink).await?;
    runtime.shutdown().await;
    Ok(())
}

/// Fails with what to install when `nats-server` cannot be run.
pub(crate) fn check_nats_server() -> anyhow::Result<()> {
    let bin = std::env::var("AGENTSAGA_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
    let ok = std::process::Command::new(&bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ensure!(
        ok,
        "`{bin} --version` does not run: --transport nats needs nats-server (the Debian \
         package `nats-server`, which scripts/test installs; or AGENTSAGA_NATS_SERVER=path)"
    );
    Ok(())
}

/// A throwaway `nats-server -js` (started off the async threads: it waits until the
/// server listens).
pub(crate) async fn nats_server() -> anyhow::Result<NatsServer> {
    tokio::task::spawn_blocking(NatsServer::start)
        .await
        .context("starting nats-server")
}

/// One run over NATS: the orchestrator here on `url`, the agents in a child process on
/// the SQLite database `agents_url`, a fresh broker.
pub(super) async fn nats_run(
    backend: Backend,
    url: &str,
    agents_url: &str,
    scenario: Scenario,
    n: usize,
    workers: usize,
) -> anyhow::Result<Run> {
    let server = nats_server().await?;
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut command = tokio::process::Command::new(exe);
    command
        .arg("saga-agents-child")
        .args(["--nats", &server.url(), "--database", agents_url])
        .args(["--workers", &workers.to_string()]);
    if crate::db::sqlite_full_sync() {
        command.arg("--full-sync");
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting saga-agents-child")?;
    let stdout = child.stdout.take().context("no stdout from the agents")?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .context("the agents' process did not get ready within 60 s")??;
    if ready.as_deref() != Some("ready") {
        let status = child.wait().await?;
        bail!("the agents' process did not start ({status}): it said {ready:?}");
    }
    let link = NatsLink::connect(&server.url(), ORCHESTRATOR_SERVICE).await?;
    let mut builder = Runtime::builder()
        .database(url)
        .store_config(store_config())
        .saga(definition()?)
        .relay_config(RelayConfig::default().workers(workers));
    for (_, destination) in STEPS {
        builder = builder.remote(destination, &link);
    }
    let run = measure(backend, url, scenario, n, builder.start().await?).await;
    drop(child.stdin.take());
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .context("the agents' process did not stop within 60 s")??;
    let run = run?;
    ensure!(status.success(), "the agents' process failed: {status}");
    Ok(run)
}

/// (in-process runtime, over NATS): the runs of median rate, the two alternating
/// which goes first, each in fresh databases.
pub(super) async fn figure(
    backend: Backend,
    scenario: Scenario,
    sizes: Sizes,
    workers: usize,
    scratch: &mut Scratch,
) -> anyhow::Result<(Run, Run)> {
    let (mut local, mut remote) = (Vec::new(), Vec::new());
    for round in 0..sizes.rounds {
        let nats_first = round % 2 == 1;
        for over_nats in [nats_first, !nats_first] {
            let url = scratch.fresh_url(backend).await?;
            let run = if over_nats {
                let agents_url = scratch.fresh_url(Backend::Sqlite).await?;
                nats_run(backend, &url, &agents_url, scenario, sizes.sagas, workers).await?
            } else {
                runtime_run(backend, &url, scenario, sizes.sagas, workers).await?
            };
            eprintln!(
                "{:<8} {:<12} round {}/{}  {:<10} {:>8.0} sagas/s  p50 {:>6.1} ms  p99 {:>6.1} ms",
                backend.name(),
                scenario.name(),
                round + 1,
                sizes.rounds,
                if over_nats { "nats" } else { "in-process" },
                run.rate,
                percentile(&run.latencies, 50.0),
                percentile(&run.latencies, 99.0),
            );
            if over_nats {
                remote.push(run);
            } else {
                local.push(run);
            }
        }
    }
    Ok((super::figure::pooled(local), super::figure::pooled(remote)))
}
