//! The trip_booking example's saga and agents (`examples/support/`) on
//! `agentsaga::testing::TestRuntime`, as a user tests theirs: random faults of every kind
//! drawn from seeds, each run checked against the promises (`check_promises`) and
//! against the example's own tables and its car rental company. In seconds, in one
//! process; the `kill -9` runs of the example stay in `tests/trip_booking.rs`.

#[path = "../examples/support/trip_agents.rs"]
mod agents;
#[path = "../examples/support/car_rental.rs"]
mod car_rental;
#[path = "../examples/support/trip_forward.rs"]
mod forward;
#[path = "../examples/support/trip_sagas.rs"]
#[allow(dead_code)] // `business_trip` is the example's, not this test's
mod sagas;
#[path = "../examples/support/mod.rs"]
mod support;

use std::collections::BTreeMap;

use agents::{Booking, BookingAgent, CarRentalAgent, DDL, Trip};
use agentsaga::core::{Sql, Store};
use agentsaga::runtime::{Runtime, RuntimeBuilder};
use agentsaga::saga::{SagaId, SagaState};
use agentsaga_runtime::testing::{self, SEED_VAR, TestRuntime};

fn trip_runtime(rental_url: &str) -> RuntimeBuilder {
    let booking = |destination, table| BookingAgent {
        destination,
        table,
        seed: 0,
        fail_rate: 0.0,
    };
    Runtime::builder()
        .agent(booking("flights", "trip_flights"))
        .agent(booking("hotels", "trip_hotels"))
        .calling_agent(CarRentalAgent {
            api: car_rental::Client::new(rental_url).expect("the stand-in's URL"),
            seed: 0,
            fail_rate: 0.0,
        })
        .agent(forward::PaymentAgent {
            seed: 0,
            fail_rate: 0.0,
        })
        .agent(forward::ConfirmationAgent {
            seed: 0,
            fail_rate: 0.0,
        })
        .saga(sagas::trip_booking(None).expect("the example's saga"))
}

/// Saga `id`'s row in `table`: its status, or `"charged"`/`"sent"` for the forward
/// tables, if any.
async fn status(store: &Store, table: &str, id: SagaId) -> Option<String> {
    Sql::new(format!("SELECT status FROM {table} WHERE saga_id = ?"))
        .bind(id.to_string())
        .fetch_optional(store.reader())
        .await
        .expect("the example's table")
        .map(|r| r.text("status").expect("a status"))
}

/// What the example's tables must say of a saga that ended `state`: a completed trip
/// holds its three reservations, its charge and its confirmation; a compensated one
/// holds no reservation in force and was never charged; a stuck one (a fatal error
/// after the charge) was charged and undid nothing.
async fn tables_agree(store: &Store, id: SagaId, state: SagaState) -> Result<(), String> {
    let mut booked = Vec::new();
    for table in ["trip_flights", "trip_hotels", "trip_cars"] {
        booked.push((table, status(store, table, id).await));
    }
    let charged = status(store, "trip_payments", id).await.is_some();
    let confirmed = status(store, "trip_confirmations", id).await.is_some();
    let in_force = |s: &Option<String>| s.as_deref() == Some("booked");
    let ok = match state {
        SagaState::Completed => booked.iter().all(|(_, s)| in_force(s)) && charged && confirmed,
        SagaState::Compensated => {
            !booked.iter().any(|(_, s)| in_force(s)) && !charged && !confirmed
        }
        SagaState::Stuck => !charged || booked.iter().all(|(_, s)| in_force(s)),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the tables disagree with a {} trip: reservations {booked:?}, charged {charged}, \
             confirmed {confirmed}",
            state.as_str()
        ))
    }
}

// 30 trips, each under random faults from its own seed (a quarter of the deliveries:
// retryable, fatal, timed out, dead-lettered, delivered twice). Each keeps every
// promise, the example's tables agree with how it ended, and the rental company holds
// as many rentals in force as the trips that kept their car. Both ends are reached.
#[tokio::test]
async fn trips_under_random_faults_keep_their_promises() {
    let rental = car_rental::start(1).await.expect("the rental stand-in");
    let seeds = testing::seeds(0..30).unwrap();
    let mut ends: BTreeMap<&str, usize> = BTreeMap::new();
    let mut cars_kept = 0;
    for seed in seeds {
        let t = TestRuntime::start(trip_runtime(&rental.base_url))
            .await
            .unwrap();
        support::create_tables(t.store(), DDL).await.unwrap();
        t.random_faults(seed, 0.25);
        let trip = Trip {
            customer: seed,
            amount_cents: 10_000 + seed,
            bookings: vec![],
        };
        let id = t.start_saga("trip_booking", &trip).await.unwrap();
        let rerun = format!("seed {seed} (run it alone with {SEED_VAR}={seed})");
        let state = t
            .run_to_end(id)
            .await
            .unwrap_or_else(|e| panic!("{rerun}: {e}"));
        t.check_promises(id)
            .await
            .unwrap_or_else(|e| panic!("{rerun}: {e}"));
        tables_agree(t.store(), id, state)
            .await
            .unwrap_or_else(|e| panic!("{rerun}, faults {:?}: {e}", t.faults_drawn()));
        if status(t.store(), "trip_cars", id).await.as_deref() == Some("booked") {
            cars_kept += 1;
        }
        *ends.entry(state.as_str()).or_default() += 1;
        t.shutdown().await;
    }
    let (_, in_force, _) = rental.counts();
    assert_eq!(
        in_force, cars_kept,
        "rentals in force at the company: {ends:?}"
    );
    eprintln!("ends: {ends:?}");
    if std::env::var(SEED_VAR).is_err() {
        assert!(ends.get("completed").copied().unwrap_or(0) > 0, "{ends:?}");
        assert!(
            ends.get("compensated").copied().unwrap_or(0) > 0,
            "{ends:?}"
        );
    }
}
