//! The `outbox` bench: how fast the store writes and drains the outbox, against the
//! same statements written by hand in plain sqlx (the *floor*).
//!
//! - `enqueue_single_rate`: transactions of one message each (`store.begin()`,
//!   `tx.enqueue`, `tx.commit()`); floor: the same INSERT in a plain sqlx transaction.
//! - `enqueue_batch100_rate`: transactions of 100 messages (`tx.enqueue_batch`); floor:
//!   one hand-written multi-row `INSERT … VALUES (…), (…), …` per transaction.
//! - `drain_rate`: a keyed backlog (1000 keys, round-robin) drained by `store.claim` of
//!   100 then `store.mark_delivered`, one claimer; floor: `UPDATE … RETURNING` of the
//!   100 oldest ready rows plus one `UPDATE` marking them delivered, *without* the
//!   per-key `NOT EXISTS` check (so without per-key order).
//!
//! Concurrency is 1 on SQLite (the store has one writer connection) and 8 tasks on
//! PostgreSQL, for the store and its floor alike. Each figure is the median of a few
//! rounds; store and floor alternate which runs first.

use std::time::Instant;

use agentsaga_core::Store;
use anyhow::Context;

use crate::common::Common;
use crate::db::{Backend, Scratch};
use crate::report::{Figure, Report};

mod drain;
mod enqueue;
mod measure;
mod plain;
mod setup;

pub(crate) use drain::{fill, floor_drain_with, prepare_template};
use drain::{floor_drain, store_drain};
use enqueue::{floor_batch, floor_single, store_batch, store_single};
pub(crate) use measure::median;
pub(crate) use plain::Plain;
pub(crate) use setup::{BATCH, DEST, KEYS, key, now_ms, payload};

const BENCH: &str = "outbox";
/// `outbox` options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: Common,
}

/// How much work each figure does.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Single-message transactions per round.
    single: usize,
    /// 100-message transactions per round.
    batches: usize,
    /// Backlog rows drained per round.
    backlog: usize,
    /// Rounds per figure (the median is reported).
    rounds: usize,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                single: 2_000,
                batches: 100,
                backlog: 10_000,
                rounds: 1,
            }
        } else {
            Self {
                single: 10_000,
                batches: 500,
                backlog: 100_000,
                rounds: 3,
            }
        }
    }
}

/// Concurrent writers: SQLite has one writer anyway; PostgreSQL gets 8.
fn concurrency(backend: Backend) -> usize {
    match backend {
        Backend::Sqlite => 1,
        Backend::Postgres => 8,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    Single,
    Batch,
    Drain,
}

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Self::Single => "enqueue_single_rate",
            Self::Batch => "enqueue_batch100_rate",
            Self::Drain => "drain_rate",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Store,
    Floor,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Self::Store => "store",
            Self::Floor => "floor",
        }
    }
}

/// Runs the `outbox` bench on the chosen backends.
pub(crate) async fn run(args: &Args, scratch: &mut Scratch) -> anyhow::Result<Report> {
    let sizes = Sizes::new(args.common.quick);
    let started = Instant::now();
    let mut report = Report::default();
    for backend in args.common.backend.backends() {
        report.notes.push(scratch.describe(backend).await?);
        for metric in [Metric::Single, Metric::Batch, Metric::Drain] {
            let (value, floor) = figure(backend, metric, sizes, scratch)
                .await
                .with_context(|| format!("{} {}", backend.name(), metric.name()))?;
            report.figures.push(Figure::rate(
                BENCH,
                backend.name(),
                metric.name(),
                value,
                floor,
            ));
        }
    }
    let rounds = if sizes.rounds == 1 {
        "one round (--quick: a smoke run, not a measurement)".to_owned()
    } else {
        format!(
            "median of {} rounds, store and floor alternating which runs first",
            sizes.rounds
        )
    };
    report.notes.extend([
        format!(
            "method: {rounds}; every floor runs in its own fresh database with the same \
             migrations; concurrency 1 on sqlite, 8 tasks on postgres (pools of 16), for \
             store and floor alike"
        ),
        format!(
            "enqueue: {} one-message transactions and {} transactions of {BATCH} messages \
             per round, ~60-byte JSON payloads, 1000 keys",
            sizes.single, sizes.batches
        ),
        format!(
            "drain: a backlog of {} rows over {KEYS} keys round-robin, filled untimed in a \
             template database (then VACUUM ANALYZE on postgres, a WAL checkpoint on \
             sqlite), each drain on a fresh copy of it; claims of {BATCH} + mark \
             delivered, one claimer; the floor skips the per-key NOT EXISTS check, so it \
             does not keep per-key order",
            sizes.backlog
        ),
        format!(
            "whole run: {:.1} s; ratio = value / floor, target >= {}",
            started.elapsed().as_secs_f64(),
            crate::report::TARGET_RATIO
        ),
    ]);
    Ok(report)
}

/// Measures one figure: (store median, floor median), in msgs/s.
async fn figure(
    backend: Backend,
    metric: Metric,
    sizes: Sizes,
    scratch: &mut Scratch,
) -> anyhow::Result<(f64, f64)> {
    // Enqueue figures reuse one database per side across rounds. The drain needs a
    // fresh backlog per round and side: copies of one filled template, so that every
    // drain starts from the same rows.
    let mut enqueue_dbs = None;
    let mut backlog_template = None;
    match metric {
        Metric::Single | Metric::Batch => {
            let store = Store::connect(&scratch.fresh_url(backend).await?).await?;
            let plain = Plain::open(backend, &scratch.fresh_url(backend).await?).await?;
            enqueue_dbs = Some((store, plain));
        }
        Metric::Drain => {
            let url = scratch.fresh_url(backend).await?;
            fill(&url, sizes.backlog).await?;
            prepare_template(backend, &url).await?;
            backlog_template = Some(url);
        }
    }
    let tasks = concurrency(backend);
    let mut rates = (Vec::new(), Vec::new());
    for round in 0..sizes.rounds {
        let order = if round % 2 == 0 {
            [Side::Floor, Side::Store]
        } else {
            [Side::Store, Side::Floor]
        };
        for side in order {
            let rate = match (&enqueue_dbs, metric, side) {
                (Some((store, _)), Metric::Single, Side::Store) => {
                    store_single(store, sizes.single, tasks).await?
                }
                (Some((_, plain)), Metric::Single, Side::Floor) => {
                    floor_single(plain, sizes.single, tasks).await?
                }
                (Some((store, _)), Metric::Batch, Side::Store) => {
                    store_batch(store, sizes.batches, tasks).await?
                }
                (Some((_, plain)), Metric::Batch, Side::Floor) => {
                    floor_batch(plain, sizes.batches, tasks).await?
                }
                (_, Metric::Drain, side) => {
                    let template = backlog_template.as_deref().context("no backlog")?;
                    let url = scratch.copy_of(backend, template).await?;
                    match side {
                        Side::Store => store_drain(&url, sizes.backlog).await?,
                        Side::Floor => floor_drain(backend, &url, sizes.backlog).await?,
                    }
                }
                (None, _, _) => unreachable!("enqueue figures have their databases"),
            };
            eprintln!(
                "{:<8} {:<22} round {}/{}  {:<5} {:>10.0} msgs/s",
                backend.name(),
                metric.name(),
                round + 1,
                sizes.rounds,
                side.name(),
                rate
            );
            match side {
                Side::Store => rates.0.push(rate),
                Side::Floor => rates.1.push(rate),
            }
        }
    }
    if let Some((store, plain)) = enqueue_dbs {
        store.close().await;
        plain.close().await;
    }
    Ok((median(rates.0), median(rates.1)))
}
