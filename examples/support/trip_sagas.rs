//! The sagas of `examples/trip_booking.rs`: `trip_booking`, and `business_trip`, which
//! books its trip as a child saga.

use std::time::Duration;

use agentsaga::prelude::*;
use agentsaga::saga::SagaDefinition;

use super::{Booking, Trip};

/// Reserve a flight, then a hotel and a car in parallel (each undone by cancelling the
/// reservation its reply named), charge the card (the pivot), send a confirmation.
/// With `sleep`, the trip sleeps that long after the charge (`Step::sleep`, a durable
/// timer: a process killed meanwhile loses nothing): version 2 of the saga.
pub(crate) fn trip_booking(sleep: Option<Duration>) -> anyhow::Result<SagaDefinition> {
    let retry = RetryPolicy::new(Duration::from_millis(50), Duration::from_secs(1), 5);
    let booking = |name: &str, destination: &'static str| {
        Step::<Trip>::new(name, destination)
            .command(|t: &Trip| Booking::Reserve {
                customer: t.customer,
            })
            .on_reply(|t: &mut Trip, booking: String| t.bookings.push(booking))
            // Built when the cancellation is dispatched: the id this reservation gave.
            .compensate_with(destination, |_: &Trip, id: Option<&String>| {
                Booking::Cancel {
                    reservation_id: id.cloned(),
                }
            })
            .retry(retry)
            .timeout(Duration::from_secs(20))
    };
    let version = if sleep.is_some() { 2 } else { 1 };
    let charged = Saga::<Trip>::builder("trip_booking", version)
        .step(booking("reserve_flight", "flights"))
        .parallel([
            booking("reserve_hotel", "hotels"),
            booking("reserve_car", "cars"),
        ])
        .pivot(
            Step::new("charge_payment", "payments")
                .command(Trip::clone)
                .retry(retry)
                .timeout(Duration::from_secs(20)),
        );
    let charged = match sleep {
        Some(d) => charged.step(Step::sleep("cool_off", d)),
        None => charged,
    };
    Ok(charged
        .step(
            Step::new("send_confirmation", "confirmations")
                .command(Trip::clone)
                .retry(retry),
        )
        .build()?)
}

/// A business trip: its `trip` step is a `trip_booking` saga of its own (a child saga),
/// whose data becomes the step's reply. `trip_booking` has a pivot (the charge), so the
/// child is the business trip's pivot too: it cannot be undone once charged.
pub(crate) fn business_trip() -> anyhow::Result<SagaDefinition> {
    Ok(Saga::<Trip>::builder("business_trip", 1)
        .pivot(
            Step::saga("trip", "trip_booking")
                .forward_only()
                .on_reply(|t: &mut Trip, booked: Trip| t.bookings = booked.bookings),
        )
        .build()?)
}
