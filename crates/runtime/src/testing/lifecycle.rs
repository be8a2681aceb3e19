//! A [`TestRuntime`]'s life: started on its own tokio runtime (the host), stopped,
//! restarted on the same database and clock, or crashed at a hop and restarted as a
//! killed process would be.

use std::sync::Arc;

use agentsaga_core::clock::ManualClock;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_core::{Sql, Store};

use super::host::Host;
use super::trace::Tracing;
use super::{PATIENCE, START_MS, TestRuntime};
use crate::faults::Faults;
use crate::{Error, Result, RuntimeBuilder};

impl TestRuntime {
    /// Starts `builder` (your agents and sagas, as in production) on a fresh SQLite file
    /// in a temporary directory (removed when the test process ends), its clock a
    /// [`ManualClock`] standing at [`START_MS`]. The builder's database is replaced;
    /// its store configuration is kept but for the clock. The runtime's tasks run on a
    /// tokio runtime of their own (two worker threads), whatever runs the test.
    ///
    /// # Errors
    /// As [`RuntimeBuilder::start`].
    pub async fn start(builder: RuntimeBuilder) -> Result<Self> {
        Self::start_at(builder, START_MS).await
    }

    /// [`start`](Self::start) with the clock at `start_ms` (Unix milliseconds).
    ///
    /// # Errors
    /// As [`RuntimeBuilder::start`].
    pub async fn start_at(builder: RuntimeBuilder, start_ms: i64) -> Result<Self> {
        let url = fresh_url(Backend::Sqlite).await;
        Self::start_on_at(&url, builder, start_ms).await
    }

    /// [`start`](Self::start) on the database at `url`: a PostgreSQL database of the
    /// test's own (`postgres://…/test_db`: fresh, or left by an earlier test runtime),
    /// or a SQLite file. On PostgreSQL the database's `now()` and `clock_timestamp()`
    /// then read the test's clock: the store installs a schema `agentsaga_clock` with
    /// its own `now()` and sets the database's `search_path` to find it before
    /// PostgreSQL's, so give each test runtime a database no one else uses.
    ///
    /// # Errors
    /// As [`RuntimeBuilder::start`]; a database error installing the clock.
    pub async fn start_on(url: &str, builder: RuntimeBuilder) -> Result<Self> {
        Self::start_on_at(url, builder, START_MS).await
    }

    /// [`start_on`](Self::start_on) with the clock at `start_ms` (Unix milliseconds).
    ///
    /// # Errors
    /// As [`start_on`](Self::start_on).
    pub async fn start_on_at(url: &str, builder: RuntimeBuilder, start_ms: i64) -> Result<Self> {
        let clock = ManualClock::new(start_ms);
        let url = url.to_owned();
        let tracing = Arc::new(Tracing::new());
        let faults = Arc::new(Faults::default());
        faults.journal.start();
        let (host, runtime) = launch(builder, &url, &clock, faults, &tracing).await?;
        Ok(Self {
            runtime,
            clock,
            url,
            patience: PATIENCE,
            host,
            tracing,
        })
    }

    /// Stops the runtime, as a deploy or a restart does, and starts `builder` (your
    /// agents and sagas again, or a new version of them) on the same database and the
    /// same clock: what the first one left (sagas asleep, waiting, retrying, messages
    /// not yet delivered) the second one carries on. The faults still queued or drawn
    /// at random, and the [`ledger`](Self::ledger), carry over.
    ///
    /// After a [`crash_before_hop`](Self::crash_before_hop) that was reached, the stop
    /// is a crash: every task of the runtime stops where it stands (its tokio runtime
    /// dropped), the hop at the crash point and whatever else was not committed is
    /// lost, and the claims the dead runtime held on messages are expired (as its
    /// leases would run out) so that the next runtime delivers them again. Otherwise
    /// the stop is graceful: what the first runtime had in flight is finished or given
    /// back first.
    ///
    /// # Errors
    /// As [`RuntimeBuilder::start`]; a store error expiring a crashed runtime's claims.
    pub async fn restart(self, builder: RuntimeBuilder) -> Result<Self> {
        let Self {
            runtime,
            clock,
            url,
            patience,
            mut host,
            tracing,
        } = self;
        let faults = Arc::clone(&runtime.faults);
        let crashed = stop(runtime, &mut host).await;
        let store = Store::connect(&url).await?;
        if crashed {
            // A killed process's connections end with it (its open transactions
            // rolled back, its row locks released), and its claims expire.
            store.end_other_sessions().await?;
            expire_claims(&store).await?;
        }
        // An effect whose commit a stop cut short took effect if its message is in
        // the inbox (its hop committed; its caller never heard), else not: settled
        // now, before the next runtime delivers the message again.
        for (mark, destination, message) in faults.journal.unsettled() {
            let committed = store.seen(&destination, message).await?;
            faults.journal.settle(mark, committed);
        }
        drop(store);
        let (host, runtime) = launch(builder, &url, &clock, faults, &tracing).await?;
        Ok(Self {
            runtime,
            clock,
            url,
            patience,
            host,
            tracing,
        })
    }

    /// The runtime crashes just before its `k`-th commit of hops from now (`k` ≥ 1):
    /// an agent's outcome or an orchestrator's turn, with what it wrote, never
    /// commits, and nothing after it does. [`run_until_idle`](Self::run_until_idle)
    /// (and so [`run_to_end`](Self::run_to_end)) then reports the crash; wait for it
    /// with [`until_crash`](Self::until_crash), and [`restart`](Self::restart) the
    /// runtime as a process killed there would be. A commit holds one hop, or several
    /// when hops come at once (SQLite's lane commits them together).
    pub fn crash_before_hop(&self, k: u64) {
        self.runtime.store().crash_at_commit(k, false);
    }

    /// As [`crash_before_hop`](Self::crash_before_hop), but the crash comes just after
    /// the `k`-th commit: its hops are written, and their messages never acknowledged,
    /// so the next runtime delivers them again (the inbox must keep their effects to
    /// one).
    pub fn crash_after_hop(&self, k: u64) {
        self.runtime.store().crash_at_commit(k, true);
    }

    /// Whether the runtime has crashed at its [`crash_before_hop`](Self::crash_before_hop)
    /// (or [`crash_after_hop`](Self::crash_after_hop)).
    pub fn crashed(&self) -> bool {
        self.runtime.store().crashed()
    }

    /// Waits (real time, at most its patience) until the runtime crashes at its
    /// [`crash_before_hop`](Self::crash_before_hop).
    ///
    /// # Errors
    /// [`Error::NotAtRest`] if it came to rest first (fewer hops were left than the
    /// crash point named), or its patience ran out.
    pub async fn until_crash(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + self.patience;
        while !self.crashed() {
            if self.busy().await?.is_none() && self.busy().await?.is_none() && !self.crashed() {
                return Err(Error::NotAtRest(
                    "it came to rest before its crash point: fewer hops were left".into(),
                ));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::NotAtRest(format!(
                    "no crash after {:?} of real time",
                    self.patience
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        Ok(())
    }

    /// Stops the runtime (gracefully, or as a crash after one).
    pub async fn shutdown(self) {
        let Self {
            runtime, mut host, ..
        } = self;
        stop(runtime, &mut host).await;
    }

    /// Runs `call` (a start, a signal: work of the test's own on the runtime's
    /// database), unless the runtime crashes first: a call the crash cut short (it had
    /// joined the lane's commit that never comes) fails, as a client of a crashed
    /// process sees.
    pub(super) async fn unless_crashed<T>(
        &self,
        call: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let crashed = async {
            while !self.crashed() {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        };
        tokio::select! {
            out = call => out,
            () = crashed => Err(Error::NotAtRest(
                "the runtime crashed at its crash point while this call waited on it".into(),
            )),
        }
    }
}

/// Starts `builder` under test on a host of its own: on the database at `url`, on
/// `clock`, its agents taking `faults`, its threads tracing through `tracing`.
async fn launch(
    builder: RuntimeBuilder,
    url: &str,
    clock: &ManualClock,
    faults: Arc<Faults>,
    tracing: &Tracing,
) -> Result<(Host, crate::Runtime)> {
    let host = Host::new(&tracing.dispatch)?;
    let runtime = host
        .start(builder.under_test(url.to_owned(), clock.clock(), faults))
        .await?;
    Ok((host, runtime))
}

/// Stops `runtime` on `host`: after a crash, as a killed process stops (every task
/// dropped where it stands); else gracefully, its crash point disarmed first (a stop
/// must not hang at it). Whether it had crashed.
async fn stop(runtime: crate::Runtime, host: &mut Host) -> bool {
    let crashed = runtime.store().crashed();
    if crashed {
        host.kill();
        drop(runtime);
    } else {
        runtime.store().crash_at_commit(0, false);
        runtime.shutdown().await;
        host.kill();
    }
    crashed
}

/// Expires every claim on `store` (every row in flight), as the leases of a runtime
/// killed there run out: the next runtime delivers those rows again.
async fn expire_claims(store: &Store) -> Result<()> {
    let mut tx = store.begin().await?;
    Sql::new("UPDATE outbox SET lease_until = ? WHERE state = 'in_flight'")
        .bind_time(0)
        .execute(tx.conn())
        .await?;
    tx.commit().await?;
    Ok(())
}
