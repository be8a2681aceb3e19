//! Starting a relay, and the handle that stops it.

use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::Store;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use tokio::task::JoinHandle;

use crate::claimer::{Claimer, ClaimerMsg};
use crate::stats::StatsCell;
use crate::{Error, RelayConfig, RelayStats, Result, Transport};

/// Beyond `shutdown_timeout`, how long [`Relay::shutdown`] lets the final
/// database writes take before it kills the relay.
const FINAL_WRITE_GRACE: Duration = Duration::from_secs(5);

impl Relay {
    /// Starts a relay delivering the outbox rows of `destinations` through `transport`.
    ///
    /// It runs until [`Relay::shutdown`] (or until the handle is dropped, which
    /// starts the same graceful shutdown without waiting for it). Several relays may run
    /// against one PostgreSQL database; each needs its own `owner`.
    ///
    /// # Errors
    /// [`Error::Config`] for an unusable configuration or no destinations,
    /// [`Error::Spawn`] if its actors cannot be started. The database is not
    /// touched here: an unreachable database is logged and retried once running.
    pub async fn start(
        store: Store,
        destinations: Vec<String>,
        transport: Arc<dyn Transport>,
        config: RelayConfig,
    ) -> Result<Relay> {
        config.validate()?;
        let mut unique: Vec<String> = Vec::with_capacity(destinations.len());
        for d in destinations {
            if d.trim().is_empty() {
                return Err(Error::Config("a destination is empty".to_owned()));
            }
            if !unique.contains(&d) {
                unique.push(d);
            }
        }
        if unique.is_empty() {
            return Err(Error::Config("no destinations to relay".to_owned()));
        }
        let stats = Arc::new(StatsCell::default());
        let claimer = Claimer {
            store,
            destinations: unique,
            transport,
            config: config.clone(),
            stats: Arc::clone(&stats),
        };
        let (claimer, join) = Actor::spawn(None, claimer, ())
            .await
            .map_err(|e| Error::Spawn(e.to_string()))?;
        Ok(Relay {
            owner: config.owner,
            stats,
            claimer,
            join: Some(join),
            shutdown_timeout: config.shutdown_timeout,
        })
    }
}

/// A running relay.
///
/// Dropping it starts a graceful shutdown in the background; call
/// [`shutdown`](Self::shutdown) to wait for it.
pub struct Relay {
    owner: String,
    stats: Arc<StatsCell>,
    claimer: ActorRef<ClaimerMsg>,
    join: Option<JoinHandle<()>>,
    shutdown_timeout: Duration,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("owner", &self.owner)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// The relay's counters so far.
    pub fn stats(&self) -> RelayStats {
        self.stats.snapshot()
    }

    /// The destinations paused now by their circuit breaker, each with when (by the
    /// store's clock) its next probe may go; a time already passed: its probe is due.
    pub fn pauses(&self) -> Vec<(String, tokio::time::Instant)> {
        self.stats.pauses()
    }

    /// A cloneable reader of the counters, for samplers that outlive a borrow of the
    /// handle (metrics).
    pub fn stats_reader(&self) -> impl Fn() -> RelayStats + Send + Sync + 'static {
        let stats = Arc::clone(&self.stats);
        move || stats.snapshot()
    }

    /// The lease owner this relay writes on the rows it claims.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Stops gracefully: no more claims; deliveries in flight get up to
    /// `shutdown_timeout` to finish; their outcomes are written; rows still unfinished
    /// are released (back to pending, the attempt not counted); the actors stop.
    pub async fn shutdown(mut self) {
        let Some(join) = self.join.take() else {
            return;
        };
        let patience = self.shutdown_timeout + FINAL_WRITE_GRACE;
        let answer = self
            .claimer
            .call(|reply| ClaimerMsg::Shutdown(Some(reply)), Some(patience))
            .await;
        if !matches!(answer, Ok(CallResult::Success(()))) && !join.is_finished() {
            tracing::warn!(owner = %self.owner, "relay did not stop in time; killing it");
            // Its rows return to the pool when their leases expire.
            self.claimer.kill();
        }
        if let Err(e) = join.await {
            tracing::warn!(owner = %self.owner, error = %e, "relay task ended badly");
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.join.is_some() {
            let _ = self.claimer.cast(ClaimerMsg::Shutdown(None));
        }
    }
}
