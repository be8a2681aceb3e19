//! The console's overview at scale: `Console::status` (what the page re-fetches every
//! 2 s per open tab, and `agentsaga status`) against a database holding many finished
//! sagas (default 1,000,000: 80 % completed, 10 % compensated, 10 % aborted) and a few
//! running ones (100). The rows are written straight into `saga_instances` (their
//! steps are not: the overview does not read them). Figures: the first call, and the
//! median and the slowest of the next calls; the target is 50 ms (issue 31).

use std::time::{Duration, Instant};

use agentsaga_console::Console;
use agentsaga_core::Store;

use crate::db::{self, Scratch};
use crate::report::{Figure, Report, Target};

/// `agentsaga-bench status`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: crate::common::Common,
    /// Finished sagas in the database.
    #[arg(long, default_value_t = 1_000_000)]
    sagas: u64,
    /// Status calls timed after the first.
    #[arg(long, default_value_t = 20)]
    calls: u32,
}

/// The most a status call may take (issue 31).
const TARGET_MS: f64 = 50.0;

/// Running sagas besides the finished ones.
const RUNNING: u64 = 100;

pub(crate) async fn run(args: &Args, scratch: &mut Scratch) -> anyhow::Result<Report> {
    let mut report = Report::default();
    let sagas = if args.common.quick {
        10_000
    } else {
        args.sagas
    };
    for backend in args.common.backend.backends() {
        report.notes.push(scratch.describe(backend).await?);
        let url = scratch.fresh_url(backend).await?;
        let store = Store::connect(&url).await?;
        let filled = Instant::now();
        fill(backend, &url, sagas).await?;
        report.notes.push(format!(
            "status {}: {sagas} finished and {RUNNING} running sagas written in {:.1} s",
            backend.name(),
            filled.elapsed().as_secs_f64()
        ));
        let console = Console::new(store.clone());
        let name = backend.name();
        // On PostgreSQL the fill left a million count deltas (one per saga written);
        // a runtime folds them every 5 s, `prune` after it deletes. The overview before
        // and after that fold, and the fold itself.
        if backend == db::Backend::Postgres {
            let (unfolded, _) = timed(&console).await?;
            let t = Instant::now();
            let folded = agentsaga_saga::query::fold_finished_counts(&store).await?;
            let fold = t.elapsed();
            for (what, took) in [
                ("status, a million deltas unfolded", unfolded),
                ("fold of the deltas", fold),
            ] {
                let ms = took.as_secs_f64() * 1000.0;
                report
                    .figures
                    .push(Figure::new("status", name, what, ms, "ms"));
            }
            report.notes.push(format!(
                "status {name}: {folded} count deltas folded (as a runtime does every 5 s), then the deltas' table vacuumed (as autovacuum does after such a delete), before the timed calls"
            ));
            let pool = db::plain_postgres(&url).await?;
            sqlx::query("VACUUM ANALYZE saga_finished_deltas")
                .execute(&pool)
                .await?;
            pool.close().await;
        }
        let (first, doc) = timed(&console).await?;
        anyhow::ensure!(
            doc.sagas_total == sagas + RUNNING,
            "the overview counts {} sagas, not {}",
            doc.sagas_total,
            sagas + RUNNING
        );
        let mut times = Vec::new();
        for _ in 0..args.calls.max(1) {
            times.push(timed(&console).await?.0);
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        report.figures.push(
            Figure::new("status", name, "status, first call", ms(first), "ms")
                .target(Target::AtMost(TARGET_MS)),
        );
        report.figures.push(
            Figure::new(
                "status",
                name,
                "status, median",
                ms(times[times.len() / 2]),
                "ms",
            )
            .target(Target::AtMost(TARGET_MS)),
        );
        report.figures.push(
            Figure::new(
                "status",
                name,
                "status, slowest",
                ms(times[times.len() - 1]),
                "ms",
            )
            .target(Target::AtMost(TARGET_MS)),
        );
        store.close().await;
    }
    report.notes.push(format!(
        "status: {} timed calls after the first, one after the other",
        args.calls.max(1)
    ));
    Ok(report)
}

async fn timed(console: &Console) -> anyhow::Result<(Duration, agentsaga_console::ops::StatusDoc)> {
    let t = Instant::now();
    let doc = console.status().await?;
    Ok((t.elapsed(), doc))
}

/// Writes `n` finished sagas and [`RUNNING`] running ones, in one statement per
/// backend (ids are made up but unique and well-formed).
async fn fill(backend: db::Backend, url: &str, n: u64) -> anyhow::Result<()> {
    let total = i64::try_from(n + RUNNING)?;
    let running_from = i64::try_from(n)?;
    match backend {
        db::Backend::Sqlite => {
            let pool = db::plain_sqlite(url).await?;
            sqlx::query(
                "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1)
                 INSERT INTO saga_instances
                   (id, name, version, state, data, created_at, updated_at, finished_at)
                 SELECT printf('%08x-0000-7000-8000-%012x', i, i), 'trip', 1,
                   CASE WHEN i > ?2 THEN 'running'
                        WHEN i % 10 = 0 THEN 'compensated'
                        WHEN i % 10 = 1 THEN 'aborted'
                        ELSE 'completed' END,
                   '{}', 1700000000000 + i, 1700000000000 + i,
                   CASE WHEN i > ?2 THEN NULL ELSE 1700000000000 + i END
                 FROM c",
            )
            .bind(total)
            .bind(running_from)
            .execute(&pool)
            .await?;
            sqlx::query("ANALYZE").execute(&pool).await?;
            pool.close().await;
        }
        db::Backend::Postgres => {
            let pool = db::plain_postgres(url).await?;
            sqlx::query(
                "INSERT INTO saga_instances
                   (id, name, version, state, data, created_at, updated_at, finished_at)
                 SELECT (lpad(to_hex(i), 8, '0') || '-0000-7000-8000-' || lpad(to_hex(i), 12, '0'))::uuid,
                   'trip', 1,
                   CASE WHEN i > $2 THEN 'running'
                        WHEN i % 10 = 0 THEN 'compensated'
                        WHEN i % 10 = 1 THEN 'aborted'
                        ELSE 'completed' END,
                   '{}', now(), now(), CASE WHEN i > $2 THEN NULL ELSE now() END
                 FROM generate_series(1::bigint, $1::bigint) AS i",
            )
            .bind(total)
            .bind(running_from)
            .execute(&pool)
            .await?;
            sqlx::query("VACUUM ANALYZE saga_instances")
                .execute(&pool)
                .await?;
            pool.close().await;
        }
    }
    Ok(())
}
