//! Metrics: a Prometheus text endpoint (`GET /metrics`) on an address of the
//! operator's choosing (loopback by default), fed by the `metrics` crate.
//!
//! Series (all prefixed `agentsaga_`): `outbox_pending`, `outbox_in_flight`,
//! `outbox_dead` (dead letters), `outbox_unavailable` (pending rows waiting for a
//! destination that cannot be reached, a broker away: they spend no attempts),
//! `outbox_lag_seconds` (age of the oldest ready pending row), `sagas{state}` (sagas by state), `saga_starts_waiting` (starts beyond the
//! admission bound, not yet started) — sampled from the database —,
//! `sagas_stalled` and `stalled_warnings_total` (from the stall watch, every 30 s by
//! default: `RuntimeBuilder::stalled_after`) and, from this
//! process's relay, `deliveries_total`, `retries_total`, `dead_letters_total`,
//! `relay_paused_destinations` (destinations its circuit breakers hold back),
//! `delivery_latency_seconds{quantile="0.5"|"0.99"}` (enqueue commit → delivered);
//! from this process's orchestrators, `saga_duration_seconds` (a summary of settled
//! sagas' start → end) and `saga_usage_total{saga,kind}` (what the sagas whose end
//! this process saw used, by saga name and kind: `tokens_in`, `tokens_out`,
//! `cost_micros`, `calls`; a kind none used is absent).

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use agentsaga_core::Store;
use agentsaga_saga::{SagaState, query};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The default metrics address: loopback only.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9464";

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder for this process (once); `None` if another
/// recorder was installed first.
pub fn recorder() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok().map(|()| handle)
        })
        .as_ref()
}

/// A running `/metrics` endpoint; stops when dropped.
#[derive(Debug)]
pub struct MetricsEndpoint {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl MetricsEndpoint {
    /// The address it listens on (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `GET /metrics` on `addr`. A deliberately small HTTP/1.1 responder: one
/// request per connection, no keep-alive.
///
/// # Errors
/// The bind error, or an error if another metrics recorder is installed.
pub async fn serve(addr: SocketAddr) -> std::io::Result<MetricsEndpoint> {
    let handle =
        recorder().ok_or_else(|| std::io::Error::other("another metrics recorder is installed"))?;
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
                    .await
                {
                    Ok(Ok(n)) => n,
                    _ => return,
                };
                let request = String::from_utf8_lossy(&buf[..n]);
                let response = if request.starts_with("GET /metrics") {
                    let body = handle.render();
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                } else {
                    "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        .to_owned()
                };
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    tracing::info!(%addr, "metrics at http://{addr}/metrics");
    Ok(MetricsEndpoint { addr, task })
}

/// Samples the database and the relay into gauges, every `every`, until aborted.
pub(crate) fn sampler(
    store: Store,
    relay: impl Fn() -> Option<agentsaga_relay::RelayStats> + Send + Sync + 'static,
    every: Duration,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            sample(&store, &relay).await;
        }
    })
}

pub(crate) async fn sample(
    store: &Store,
    relay: &impl Fn() -> Option<agentsaga_relay::RelayStats>,
) {
    match store.admin().stats().await {
        Ok(s) => {
            metrics::gauge!("agentsaga_outbox_pending").set(s.pending as f64);
            metrics::gauge!("agentsaga_outbox_in_flight").set(s.in_flight as f64);
            metrics::gauge!("agentsaga_outbox_dead").set(s.dead as f64);
            metrics::gauge!("agentsaga_outbox_unavailable").set(s.unavailable as f64);
            let lag = s.oldest_pending_age_ms.unwrap_or(0) as f64 / 1000.0;
            metrics::gauge!("agentsaga_outbox_lag_seconds").set(lag);
        }
        Err(e) => tracing::debug!(error = %e, "metrics: outbox stats unavailable"),
    }
    match query::count_by_state(store).await {
        Ok(counts) => {
            for state in [
                SagaState::Running,
                SagaState::Compensating,
                SagaState::Completed,
                SagaState::Compensated,
                SagaState::Stuck,
                SagaState::Aborted,
            ] {
                let n = counts
                    .iter()
                    .find(|(s, _)| *s == state)
                    .map_or(0, |(_, n)| *n);
                metrics::gauge!("agentsaga_sagas", "state" => state.as_str()).set(n as f64);
            }
        }
        Err(e) => tracing::debug!(error = %e, "metrics: saga counts unavailable"),
    }
    match agentsaga_saga::Engine::waiting_starts(store).await {
        Ok(waiting) => {
            metrics::gauge!("agentsaga_saga_starts_waiting")
                .set(waiting.iter().map(|(_, n)| *n as f64).sum::<f64>());
        }
        Err(e) => tracing::debug!(error = %e, "metrics: waiting starts unavailable"),
    }
    if let Some(r) = relay() {
        metrics::counter!("agentsaga_deliveries_total").absolute(r.delivered);
        metrics::counter!("agentsaga_retries_total").absolute(r.retried);
        metrics::counter!("agentsaga_dead_letters_total").absolute(r.dead);
        metrics::gauge!("agentsaga_relay_paused_destinations").set(r.paused as f64);
        for (q, v) in [("0.5", r.latency_p50_ms), ("0.99", r.latency_p99_ms)] {
            if let Some(ms) = v {
                metrics::gauge!("agentsaga_delivery_latency_seconds", "quantile" => q)
                    .set(ms as f64 / 1000.0);
            }
        }
    }
}

/// Records a settled saga's duration and, once it has ended (completed, compensated or
/// aborted), adds what it used to its name's usage.
pub(crate) async fn saga_finished(store: &Store, saga: agentsaga_saga::SagaId) {
    if HANDLE.get().is_none() {
        return;
    }
    let Ok(Some(s)) = query::get(store, saga).await else {
        return;
    };
    let secs = (s.updated_at_ms - s.created_at_ms).max(0) as f64 / 1000.0;
    metrics::histogram!("agentsaga_saga_duration_seconds").record(secs);
    if !s.state.is_terminal() {
        // A stuck saga may yet go on and use more: its usage counts once it ends.
        return;
    }
    match query::spending(store, saga).await {
        Ok(Some(spent)) => {
            let u = spent.usage;
            for (kind, n) in [
                ("tokens_in", u.tokens_in),
                ("tokens_out", u.tokens_out),
                ("cost_micros", u.cost_micros),
                ("calls", u.calls),
            ] {
                if n > 0 {
                    metrics::counter!("agentsaga_saga_usage_total", "saga" => s.name.clone(), "kind" => kind)
                        .increment(n);
                }
            }
        }
        Ok(None) => {}
        Err(e) => tracing::debug!(error = %e, "metrics: a finished saga's usage unavailable"),
    }
}
