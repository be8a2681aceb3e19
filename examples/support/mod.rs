//! What the example orchestrators share: flags, SQL on either backend, deterministic
//! failure injection, the progress bar and the closing summary.

// Support of several targets: cargo would take a file beside the targets for a target
// of its own.
#![allow(clippy::mod_module_files)]
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::time::{Duration, Instant};

use agentsaga::core::{Conn, RetryPolicy, Sql, Store};
use agentsaga::relay::RelayConfig;
use agentsaga::runtime::{Runtime, RuntimeBuilder};
use agentsaga::saga::{SagaState, query};

/// The flags every example takes.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// Sagas to start; 0 finishes what an earlier run left unfinished, then exits.
    #[arg(long, default_value_t = 100)]
    pub sagas: u64,
    /// Probability that an agent call fails (retryable or fatal), 0.0–1.0.
    #[arg(long, default_value_t = 0.1)]
    pub fail_rate: f64,
    /// Seed of the failure injection.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Database URL (default: a SQLite file in the working directory).
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// No progress bar (logs only).
    #[arg(long)]
    pub quiet: bool,
    /// Relay lease, in milliseconds: how soon a killed process's claims return.
    #[arg(long, default_value_t = 5000)]
    pub lease_ms: u64,
    /// Serve Prometheus metrics at http://127.0.0.1:9464/metrics.
    #[arg(long)]
    pub metrics: bool,
    /// Admission bound: sagas in flight at once (default: the runtime's, 1000).
    #[arg(long, hide = true)]
    pub max_in_flight: Option<usize>,
    /// Serve Prometheus metrics on this address instead (implies --metrics).
    #[arg(long, env = "AGENTSAGA_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

impl CommonArgs {
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(0.0..=1.0).contains(&self.fail_rate) {
            anyhow::bail!(
                "--fail-rate must be between 0 and 1, got {}",
                self.fail_rate
            );
        }
        Ok(())
    }

    /// Where to serve metrics, if anywhere.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_addr.or_else(|| {
            self.metrics.then(|| {
                agentsaga::runtime::metrics::DEFAULT_ADDR
                    .parse()
                    .expect("valid default")
            })
        })
    }

    pub fn url(&self, default_file: &str) -> String {
        self.database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{default_file}"))
    }
}

/// Runs `sql` (its parameters `?`) with text parameters, on whichever backend the
/// connection is (see [`Sql`]).
pub async fn exec(
    conn: Conn<'_>,
    sql: &str,
    params: &[&str],
) -> Result<u64, agentsaga::core::Error> {
    let mut q = Sql::new(sql.to_owned());
    for p in params {
        q = q.bind(*p);
    }
    q.execute(conn).await
}

/// The column `column` of the row `sql` returns, as text (`None`: no row), on either
/// backend (`?` parameters, as [`exec`]).
pub async fn fetch_text(
    conn: Conn<'_>,
    sql: &str,
    params: &[&str],
) -> Result<Option<String>, agentsaga::core::Error> {
    let mut q = Sql::new(sql.to_owned());
    for p in params {
        q = q.bind(*p);
    }
    let Some(row) = q.fetch_optional(conn).await? else {
        return Ok(None);
    };
    let column = row.columns().first().cloned().unwrap_or_default();
    row.opt_text(&column)
}

/// Creates the example's tables if missing (portable DDL). Two processes starting
/// together can race on PostgreSQL's catalog even with IF NOT EXISTS: try again.
pub async fn create_tables(store: &Store, ddl: &[&str]) -> anyhow::Result<()> {
    let mut attempt = 0;
    loop {
        let result: anyhow::Result<()> = async {
            let mut tx = store.begin().await?;
            for stmt in ddl {
                exec(tx.conn(), stmt, &[]).await?;
            }
            tx.commit().await?;
            Ok(())
        }
        .await;
        match result {
            Ok(()) => return Ok(()),
            Err(e) if attempt < 5 => {
                attempt += 1;
                tracing::debug!(error = %e, "creating tables raced; again");
                tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A failure decided by the seed, the message and the step: the same delivery fails
/// the same way in every run, so a run is reproducible.
pub fn roll(seed: u64, message_id: &str, salt: &str) -> f64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    (seed, message_id, salt).hash(&mut h);
    fastrand::Rng::with_seed(h.finish()).f64()
}

/// Counts of sagas by state.
pub async fn counts(store: &Store) -> anyhow::Result<std::collections::BTreeMap<SagaState, u64>> {
    Ok(query::count_by_state(store).await?.into_iter().collect())
}

/// Starts still waiting for room under the admission bound.
pub async fn waiting(store: &Store) -> anyhow::Result<u64> {
    Ok(agentsaga::saga::Engine::waiting_starts(store)
        .await?
        .iter()
        .map(|(_, n)| n)
        .sum())
}

pub fn unfinished(c: &std::collections::BTreeMap<SagaState, u64>) -> u64 {
    c.get(&SagaState::Running).copied().unwrap_or(0)
        + c.get(&SagaState::Compensating).copied().unwrap_or(0)
}

/// Sagas parked at a wait for one of `signals` (a person's approval).
pub async fn parked(store: &Store, signals: &[&str]) -> anyhow::Result<Vec<query::SagaSummary>> {
    if signals.is_empty() {
        return Ok(Vec::new());
    }
    let list = query::list(
        store,
        &query::ListFilter {
            waiting: true,
            limit: u32::MAX,
            ..query::ListFilter::default()
        },
    )
    .await?;
    Ok(list
        .into_iter()
        .filter(|s| {
            s.waiting_for
                .as_deref()
                .is_some_and(|w| signals.contains(&w))
        })
        .collect())
}

/// Runs `read` until it succeeds: the database may go away for a while (an outage, a
/// restart). Each failure is said, then waited out (100 ms, doubling up to 5 s).
pub async fn retrying<T, F, Fut>(mut read: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let mut backoff = Duration::from_millis(100);
    loop {
        match read().await {
            Ok(v) => return v,
            Err(e) => {
                tracing::warn!(error = %e, "database unavailable; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Waits until no saga is running or compensating (sagas parked at a wait for one of
/// `signals` aside: a wait for another signal, one that ends by time, is waited out)
/// and no start waits, with a progress bar.
pub async fn wait_all(store: &Store, quiet: bool, signals: &[&str]) -> anyhow::Result<()> {
    let bar = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} sagas settled {msg}",
            )
            .expect("valid template"),
        );
        b
    };
    let mut last_log = Instant::now();
    // What was left at the first count: the bar's length.
    let mut start_left = None;
    loop {
        let (c, waiting_starts, parked) = retrying(|| async {
            let c = counts(store).await?;
            let w = waiting(store).await?;
            let p = parked(store, signals).await?.len() as u64;
            Ok((c, w, p))
        })
        .await;
        let left = (unfinished(&c) + waiting_starts).saturating_sub(parked);
        let start_left = *start_left.get_or_insert_with(|| {
            bar.set_length(left);
            left
        });
        bar.set_position(start_left.saturating_sub(left));
        bar.set_message(format!(
            "(completed {}, compensated {}, stuck {})",
            c.get(&SagaState::Completed).unwrap_or(&0),
            c.get(&SagaState::Compensated).unwrap_or(&0),
            c.get(&SagaState::Stuck).unwrap_or(&0)
        ));
        if quiet && last_log.elapsed() > Duration::from_secs(2) {
            tracing::info!(left, "waiting for sagas to settle");
            last_log = Instant::now();
        }
        if left == 0 {
            // Late replies and moot messages still ready for delivery are consumed
            // before exit, so the outbox is left drained (future timers aside).
            let Ok(stats) = store.admin().stats().await else {
                continue;
            };
            if stats.in_flight == 0 && stats.oldest_pending_age_ms.is_none() {
                bar.finish();
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The closing summary, and how to look closer.
pub async fn summary(
    store: &Store,
    started: u64,
    elapsed: Duration,
    url: &str,
) -> anyhow::Result<()> {
    // The database may go away between the last wait and this count, too.
    let c = retrying(|| counts(store)).await;
    let get = |s| c.get(&s).copied().unwrap_or(0);
    println!();
    println!("sagas started this run : {started}");
    println!("completed              : {}", get(SagaState::Completed));
    println!("compensated            : {}", get(SagaState::Compensated));
    println!("stuck                  : {}", get(SagaState::Stuck));
    println!("elapsed                : {:.2} s", elapsed.as_secs_f64());
    if started > 0 {
        println!(
            "throughput             : {:.1} sagas/s",
            started as f64 / elapsed.as_secs_f64().max(1e-9)
        );
    }
    println!();
    println!("inspect them with:");
    println!("  cargo run -p agentsaga-cli -- --database-url '{url}' sagas list");
    println!("  cargo run -p agentsaga-cli -- --database-url '{url}' status");
    Ok(())
}

/// Console logs per RUST_LOG (default `warn`), and OTLP export when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Shut it down at exit to flush the spans.
pub fn init_telemetry(service: &str) -> anyhow::Result<agentsaga::runtime::telemetry::Telemetry> {
    Ok(agentsaga::runtime::telemetry::init(service)?)
}

/// The examples' runtime settings: quick retries, the lease from the flags, metrics if
/// asked for.
pub fn configure(builder: RuntimeBuilder, common: &CommonArgs) -> RuntimeBuilder {
    let builder = match common.max_in_flight {
        Some(n) => builder.max_sagas_in_flight(Some(n)),
        None => builder,
    };
    builder
        .compensation_retry(RetryPolicy::new(
            Duration::from_millis(50),
            Duration::from_secs(2),
            10,
        ))
        .maybe_metrics(common.metrics_addr())
        .relay_config(
            RelayConfig::default()
                .lease(Duration::from_millis(common.lease_ms))
                .poll_interval(Duration::from_millis(100))
                .retry(RetryPolicy::new(
                    Duration::from_millis(100),
                    Duration::from_secs(5),
                    20,
                )),
        )
}

/// What [`run`] does last, before it shuts the runtime down.
pub type After = Box<
    dyn for<'r> FnOnce(
        &'r Runtime,
    ) -> std::pin::Pin<Box<dyn Future<Output = anyhow::Result<()>> + 'r>>,
>;

/// Which saga [`run`] starts, and how.
pub struct Saga {
    name: &'static str,
    key: Option<Box<dyn Fn(u64) -> String>>,
    signals: &'static [&'static str],
    after: Option<After>,
}

impl Saga {
    /// The saga `name`, started without a key.
    pub fn named(name: &'static str) -> Self {
        Self {
            name,
            key: None,
            signals: &[],
            after: None,
        }
    }

    /// Runs `after` once the sagas settled and the summary is printed.
    #[allow(dead_code)] // not every example has something to do after
    pub fn then(mut self, after: After) -> Self {
        self.after = Some(after);
        self
    }

    /// Start saga `i` with the idempotency key `key(i)`: a rerun starts nothing new.
    pub fn keyed(mut self, key: impl Fn(u64) -> String + 'static) -> Self {
        self.key = Some(Box::new(key));
        self
    }

    /// Its sagas may park at a wait for one of `signals` (a person's decision): the
    /// run ends with them waiting. A saga waiting for any other signal is waited for.
    pub fn waits_for_signals(mut self, signals: &'static [&'static str]) -> Self {
        self.signals = signals;
        self
    }
}

/// Creates the tables, starts `--sagas` sagas of `saga` (50 per transaction, so a
/// kill leaves whole batches), waits for every unfinished saga, prints the summary,
/// does what `saga` has to do after, and shuts down.
pub async fn run<T: serde::Serialize>(
    runtime: Runtime,
    common: &CommonArgs,
    url: &str,
    ddl: &[&str],
    saga: Saga,
    mut data: impl FnMut(u64) -> T,
) -> anyhow::Result<()> {
    if let Some(addr) = runtime.metrics_addr() {
        eprintln!("metrics at http://{addr}/metrics");
    }
    create_tables(runtime.store(), ddl).await?;
    let started = Instant::now();
    let mut n = 0;
    while n < common.sagas {
        let batch = (common.sagas - n).min(50);
        // While sagas run, on SQLite a turn in the runtime's shared transaction
        // instead of taking the single writer from it.
        let mut tx = runtime.store().begin().await?;
        match &saga.key {
            // One start at a time: each claims its key.
            Some(key) => {
                for i in n..n + batch {
                    runtime
                        .start_saga_in_with_key(&mut tx, saga.name, &key(i), &data(i))
                        .await?;
                }
            }
            // The batch in a few statements.
            None => {
                let batch: Vec<T> = (n..n + batch).map(&mut data).collect();
                runtime.start_sagas_in(&mut tx, saga.name, &batch).await?;
            }
        }
        tx.commit().await?;
        n += batch;
    }
    wait_all(runtime.store(), common.quiet, saga.signals).await?;
    summary(runtime.store(), common.sagas, started.elapsed(), url).await?;
    if !saga.signals.is_empty() {
        let parked = parked(runtime.store(), saga.signals).await?;
        println!("waiting for a signal   : {}", parked.len());
        if let Some(first) = parked.first() {
            let signal = first.waiting_for.as_deref().unwrap_or("approval");
            println!("approve one with:");
            println!(
                "  cargo run -p agentsaga-cli -- --database-url '{url}' sagas signal {} {signal} --data '{{\"by\":\"you\"}}'",
                first.id
            );
            println!("and finish it with a run of `--sagas 0`.");
        }
    }
    if let Some(after) = saga.after {
        after(&runtime).await?;
    }
    runtime.shutdown().await;
    Ok(())
}
