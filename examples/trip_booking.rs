//! Trip booking: the saga that reserves a flight, a hotel and a car, charges the card
//! (the pivot) and sends a confirmation.
//!
//! ```sh
//! cargo run --release --example trip_booking -- --sagas 200 --fail-rate 0.2 --seed 1
//! cargo run --release --example trip_booking -- --sagas 0     # finish what a killed run left
//! cargo run --release --example trip_booking -- --database-url postgres://user@127.0.0.1/trips
//! ```
//!
//! What to look at: the summary (completed, compensated, stuck), then the tables
//! `trip_flights`, `trip_hotels`, `trip_cars`, `trip_payments`, `trip_confirmations`
//! (one row per saga at most, with a `status`; a reservation also has its
//! `reservation_id`), and `saga_steps` for the compensation ledger. Kill it with `kill -9` at any moment and run it again with `--sagas 0`:
//! every saga still ends completed or compensated, and no effect exists twice.
//!
//! Steps: `reserve_flight`, then `reserve_hotel` and `reserve_car` in parallel (each
//! with a cancel compensation), `charge_payment` (the pivot: a declined card is fatal
//! and compensates the reservations), `send_confirmation` (after the pivot, retried
//! until it succeeds).
//!
//! A reservation answers with its `reservation_id`, and its cancellation names it: the
//! compensation is built from the step's reply (`compensate_with`) when it is
//! dispatched. When the reservation's outcome is unknown (it failed, timed out, or was
//! still in flight when the saga turned back) the cancellation carries no id and
//! cancels whatever the saga reserved there, if anything.
//!
//! The car is rented from a company outside the database: `reserve_car` is a
//! [`CallingAgent`] that calls the rental company's HTTP API
//! (`examples/support/car_rental.rs`) with the step's idempotency key, holding no
//! transaction, then records the rental in `trip_cars`; its cancellation calls the API's
//! cancel with the compensation's key. A call made again (a redelivery, a retry) with a
//! key the API has seen changes nothing there. The API is `--car-rental-url`; without
//! it the example serves one itself on 127.0.0.1 and prints what it received at the
//! end.
//!
//! `--nested` starts `business_trip` sagas instead, each of which books its trip as a
//! child saga (`Step::saga`, `examples/support/trip_sagas.rs`).
//!
//! For the tests, `--record-deliveries` records every message each agent handled in
//! `agent_deliveries` (key, outbox seq, start and end), in the agent's transaction
//! (`examples/support/deliveries.rs`): `tests/faults.rs` checks per-key order with it.

#[path = "support/mod.rs"]
mod support;

#[path = "support/car_rental.rs"]
mod car_rental;

#[path = "support/deliveries.rs"]
mod deliveries;

#[path = "support/trip_sagas.rs"]
mod sagas;

#[path = "support/reconcile.rs"]
mod reconcile;

#[path = "support/trip_forward.rs"]
mod forward;

#[path = "support/trip_agents.rs"]
mod agents;

use agents::{Booking, BookingAgent, CarRentalAgent, DDL, Trip};
use agentsaga::prelude::*;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Book trips with a saga: flight, hotel, car, payment, confirmation")]
struct Args {
    #[command(flatten)]
    common: support::CommonArgs,
    /// Base URL of the car rental company's API (requests go to {URL}/rentals).
    /// Without one, the example serves a stand-in on 127.0.0.1.
    #[arg(long)]
    car_rental_url: Option<String>,
    /// Tests: record each message an agent handled in `agent_deliveries`.
    #[arg(long, hide = true)]
    record_deliveries: bool,
    /// Start `business_trip` sagas, each running a `trip_booking` as a child saga.
    #[arg(long)]
    nested: bool,
    /// Tests: stop at a shared commit (`before:<n>[:<skip>]` or `after:<n>[:<skip>]`) to
    /// be killed there. The hook exists only in builds with agentsaga-core's `testing`
    /// feature, as examples are built (with the dev-dependencies); never from the
    /// environment.
    #[arg(long, hide = true)]
    stop_at_shared_commit: Option<String>,
    /// Each trip sleeps this long after its charge, before its confirmation
    /// (`Step::sleep`: a durable timer, kept through restarts): the saga is then
    /// `trip_booking` version 2, so run every process of a database with the same.
    #[arg(long, value_name = "MS")]
    sleep_ms: Option<u64>,
    /// Reconcile on a schedule (`"*/10 * * * * *"`: every 10 s): a `reconcile` saga
    /// counts the trips charged and confirmed into `trip_reconciliations`. The run
    /// ends once `--reconciliations` more are recorded.
    #[arg(long, value_name = "CRON")]
    schedule: Option<String>,
    /// With `--schedule`: the reconciliations to wait for after the trips.
    #[arg(long, default_value_t = 3)]
    reconciliations: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let telemetry = support::init_telemetry("trip_booking")?;
    let common = &args.common;
    common.validate()?;
    if let Some(spec) = &args.stop_at_shared_commit {
        agentsaga::core::testing::stop_at_shared_commit(spec).map_err(anyhow::Error::msg)?;
    }
    let url = common.url("trip_booking.db");
    let (seed, fail_rate) = (common.seed, common.fail_rate);
    // The rental company: the one given, or a stand-in served here.
    let (rental_service, rental_url) = match &args.car_rental_url {
        Some(url) => (None, url.clone()),
        None => {
            let service = car_rental::start(seed).await?;
            let url = service.base_url.clone();
            (Some(service), url)
        }
    };
    let log = deliveries::Deliveries::new(args.record_deliveries);
    let runtime = Runtime::builder()
        .database(&url)
        .agent(log.agent(BookingAgent {
            destination: "flights",
            table: "trip_flights",
            seed,
            fail_rate,
        }))
        .agent(log.agent(BookingAgent {
            destination: "hotels",
            table: "trip_hotels",
            seed,
            fail_rate,
        }))
        .calling_agent(log.calling(CarRentalAgent {
            api: car_rental::Client::new(&rental_url)?,
            seed,
            fail_rate,
        }))
        .agent(log.agent(forward::PaymentAgent { seed, fail_rate }))
        .agent(log.agent(forward::ConfirmationAgent { seed, fail_rate }))
        .saga(sagas::trip_booking(
            args.sleep_ms.map(std::time::Duration::from_millis),
        )?)
        .saga(sagas::business_trip()?);
    let runtime = match &args.schedule {
        Some(_) => runtime.agent(reconcile::Auditor).saga(reconcile::saga()?),
        None => runtime,
    };
    let runtime = support::configure(runtime, common).start().await?;
    let mut ddl = DDL.to_vec();
    if args.record_deliveries {
        ddl.push(deliveries::DDL);
    }
    let mut saga = support::Saga::named(if args.nested {
        "business_trip"
    } else {
        "trip_booking"
    });
    if let Some(cron) = &args.schedule {
        ddl.push(reconcile::DDL);
        support::create_tables(runtime.store(), &ddl).await?;
        runtime
            .schedules()
            .ensure(&reconcile::schedule(cron))
            .await?;
        let runs = args.reconciliations;
        saga = saga.then(Box::new(move |rt| {
            Box::pin(reconcile::wait_for(
                rt,
                runs,
                std::time::Duration::from_secs(120),
            ))
        }));
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    support::run(runtime, common, &url, &ddl, saga, |i| Trip {
        customer: i,
        amount_cents: rng.u64(5_000..200_000),
        bookings: vec![],
    })
    .await?;
    if let Some(service) = rental_service {
        let (made, in_force, repeats) = service.counts();
        println!(
            "car rentals (stand-in) : {made} made, {in_force} in force, {repeats} repeated requests answered from their idempotency key"
        );
    }
    telemetry.shutdown().await;
    Ok(())
}
