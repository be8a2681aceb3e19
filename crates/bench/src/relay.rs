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
use std::time::Instant;

use anyhow::{Context, ensure};

use crate::common::Common;
use crate::db::{Backend, Scratch};
use crate::outbox::{self, BATCH};
use crate::report::{Figure, Report, Target};

mod drain;
mod latency;
mod nats;
mod setup;

pub(crate) use latency::child;
use latency::{cross_process, in_process};
pub(crate) use setup::ChildArgs;
use setup::{POLL, RATE, Sizes};

const BENCH: &str = "relay";
/// Targets from the issue.
const DRAIN_RATIO: f64 = 0.6;
const P50_IN_PROCESS_MS: f64 = 3.0;
const P99_IN_PROCESS_MS: f64 = 20.0;
const P99_CROSS_PROCESS_MS: f64 = 50.0;

/// `relay` options.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: Common,
    /// Delivery workers of the relays measured (the configuration: 8). A relay
    /// keeps up to workers + batch size rows in flight.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// `in-process` (the default): the drain to a no-op transport and the latencies;
    /// `nats`: the publish rate to NATS JetStream (a throwaway `nats-server -js`)
    /// against plain `async-nats` publishes with acknowledgements.
    #[arg(long, value_enum, default_value_t = crate::common::TransportChoice::InProcess)]
    transport: crate::common::TransportChoice,
}

/// Runs the `relay` bench on the chosen backends.
pub(crate) async fn run(args: &Args, scratch: &mut Scratch) -> anyhow::Result<Report> {
    ensure!(args.workers > 0, "--workers must be at least 1");
    let sizes = Sizes::new(args.common.quick);
    if args.transport == crate::common::TransportChoice::Nats {
        return over_nats(args, sizes, scratch).await;
    }
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

/// `--transport nats`: the relay's publish rate to JetStream against plain
/// `async-nats` publishes.
async fn over_nats(args: &Args, sizes: Sizes, scratch: &mut Scratch) -> anyhow::Result<Report> {
    crate::saga::check_nats_server()?;
    let started = Instant::now();
    let mut report = Report::default();
    let backlog = sizes.backlog / 5;
    for backend in args.common.backend.backends() {
        let name = backend.name();
        report.notes.push(scratch.describe(backend).await?);
        let (value, floor) = nats::publish(backend, backlog, sizes.rounds, args.workers, scratch)
            .await
            .with_context(|| format!("{name} nats_publish_rate"))?;
        report
            .figures
            .push(Figure::new(BENCH, name, "nats_publish_rate", value, "msgs/s").with_floor(floor));
    }
    report.notes.extend([
        format!(
            "nats publish: a backlog of {backlog} rows over {} keys round-robin (filled \
             untimed in a template database, each run on a fresh copy) drained by a relay \
             (batch_size {BATCH}, workers {}) through NatsTransport into a throwaway \
             `nats-server -js` (file store in the temp dir, fresh per run, stream \
             AGENTSAGA, 2 min duplicate window): each message published to \
             agentsaga.bench with its id as Nats-Msg-Id and marked delivered on the \
             stream's ack; timed from Relay::start until its `delivered` counter reaches \
             the backlog. The floor: {} tasks of plain async-nats, each encoding the next \
             envelope as the transport does and publishing it with its id, awaiting the \
             stream's ack before the next (no database). The stream is checked to hold \
             the backlog after every run; rounds alternate which side goes first, median \
             of {}",
            outbox::KEYS,
            args.workers,
            args.workers,
            sizes.rounds,
        ),
        format!(
            "whole run: {:.1} s; ratio = value / floor",
            started.elapsed().as_secs_f64()
        ),
    ]);
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
    outbox::prepare_template(backend, &template).await?;
    let (mut relay_rates, mut floor_rates) = (Vec::new(), Vec::new());
    for round in 0..sizes.rounds {
        let relay_first = round % 2 == 1;
        for relay_side in [relay_first, !relay_first] {
            let url = scratch.copy_of(backend, &template).await?;
            let rate = if relay_side {
                drain::relay_drain(&url, sizes.backlog, workers, Arc::new(drain::NoOp)).await?
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
