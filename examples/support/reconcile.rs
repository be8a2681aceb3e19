//! `trip_booking --schedule CRON`: a reconciliation saga on a schedule. Each firing
//! starts a `reconcile` saga whose `auditor` agent counts the trips charged and
//! confirmed and records the count in `trip_reconciliations`, one row per saga, with
//! the slot it ran for (the schedule's `{"$fire_time": "unix_ms"}`).
//!
//! The schedule is declared at every start with `Schedules::ensure`: stored the first
//! time, left alone while it is the same (so the slots missed while no process ran
//! are caught up, up to 100), replaced when the expression changes. It stays in the
//! database: a run without `--schedule` does not fire it (it has no `reconcile`
//! saga), `agentsaga schedules delete reconcile` removes it.

use std::time::Duration;

use agentsaga::core::Sql;
use agentsaga::prelude::*;
use agentsaga::saga::SagaDefinition;
use agentsaga::saga::schedule::{CatchUp, Overlap, Schedule};
use serde::{Deserialize, Serialize};
use serde_json::json;

pub(crate) const DDL: &str = "CREATE TABLE IF NOT EXISTS trip_reconciliations (saga_id TEXT PRIMARY KEY, slot_ms TEXT NOT NULL, charged TEXT NOT NULL, confirmed TEXT NOT NULL)";

/// What a firing hands its saga.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Audit {
    /// The slot, Unix ms.
    pub(crate) at: i64,
}

/// `reconcile`: one step, the audit.
pub(crate) fn saga() -> anyhow::Result<SagaDefinition> {
    Ok(Saga::<Audit>::builder("reconcile", 1)
        .pivot(
            Step::new("audit", "auditor")
                .command(Audit::clone)
                .retry(RetryPolicy::new(
                    Duration::from_millis(50),
                    Duration::from_secs(1),
                    10,
                )),
        )
        .build()?)
}

/// The schedule: `reconcile` at the times `cron` names, every slot run (overlap
/// allowed) and up to 100 missed slots caught up.
pub(crate) fn schedule(cron: &str) -> Schedule {
    Schedule::new("reconcile", "reconcile", cron)
        .input(json!({ "at": { "$fire_time": "unix_ms" } }))
        .overlap(Overlap::Allow)
        .catch_up(CatchUp::All { max: 100 })
}

/// Counts the trips charged and confirmed, in the saga's transaction.
pub(crate) struct Auditor;

#[async_trait::async_trait]
impl Agent for Auditor {
    type Command = Audit;
    type Reply = String;

    fn destination(&self) -> &str {
        "auditor"
    }

    async fn handle(&self, ctx: &mut AgentContext<'_>, audit: Audit) -> Result<String, StepError> {
        let saga = ctx
            .saga_id()
            .map(|s| s.to_string())
            .ok_or_else(|| StepError::fatal("no saga id"))?;
        let count = async |ctx: &mut AgentContext<'_>, sql: &str| {
            super::support::fetch_text(ctx.conn(), sql, &[])
                .await
                .map(|n| n.unwrap_or_default())
        };
        let charged = count(ctx, "SELECT CAST(COUNT(*) AS TEXT) FROM trip_payments").await?;
        let confirmed = count(ctx, "SELECT CAST(COUNT(*) AS TEXT) FROM trip_confirmations").await?;
        super::support::exec(
            ctx.conn(),
            "INSERT INTO trip_reconciliations (saga_id, slot_ms, charged, confirmed) VALUES (?, ?, ?, ?)",
            &[&saga, &audit.at.to_string(), &charged, &confirmed],
        )
        .await?;
        Ok(format!("{charged} charged, {confirmed} confirmed"))
    }
}

/// After the trips: waits until `runs` more reconciliations are recorded (at most
/// `limit`), then prints them.
pub(crate) async fn wait_for(runtime: &Runtime, runs: u64, limit: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    let count = || async {
        let n = Sql::new("SELECT COUNT(*) AS n FROM trip_reconciliations")
            .fetch_one(runtime.store().reader())
            .await?
            .int("n")?;
        anyhow::Ok(u64::try_from(n).unwrap_or(0))
    };
    let runs = count().await? + runs;
    let mut n = count().await?;
    while n < runs && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        n = count().await?;
    }
    let view = runtime.schedules().get("reconcile").await?;
    let rows = Sql::new(
        "SELECT slot_ms, charged, confirmed FROM trip_reconciliations ORDER BY slot_ms DESC LIMIT 1",
    )
    .fetch_all(runtime.store().reader())
    .await?;
    println!(
        "reconciliations        : {n} recorded (schedule `reconcile`: {} fired, {} skipped)",
        view.as_ref().map_or(0, |v| v.fired),
        view.as_ref().map_or(0, |v| v.skipped),
    );
    if let Some(last) = rows.first() {
        println!(
            "last reconciliation    : slot {} ms, {} charged, {} confirmed",
            last.text("slot_ms")?,
            last.text("charged")?,
            last.text("confirmed")?
        );
    }
    anyhow::ensure!(
        n >= runs,
        "only {n} of {runs} reconciliations within {limit:?}"
    );
    Ok(())
}
