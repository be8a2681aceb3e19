//! The trip's data and its booking agents, of `examples/trip_booking.rs` (shared with
//! the tests that run them on `agentsaga::testing::TestRuntime`): the flight and the
//! hotel (database-only agents), the car (an outside call to the rental company's API),
//! and the tables they write.

use agentsaga::prelude::*;
use serde::{Deserialize, Serialize};

use super::{car_rental, support};

/// The saga's data.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Trip {
    pub(crate) customer: u64,
    pub(crate) amount_cents: u64,
    #[serde(default)]
    pub(crate) bookings: Vec<String>,
}

/// Every booking agent's command: reserve, or (the compensation) cancel.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Booking {
    Reserve {
        customer: u64,
    },
    /// The reservation the step's reply named; `None` when its outcome is unknown.
    Cancel {
        #[serde(default)]
        reservation_id: Option<String>,
    },
}

/// `trip_flights`, `trip_hotels`: one row per saga, booked or cancelled, with its
/// `reservation_id` (what the reservation answers, and its cancellation names).
pub(crate) struct BookingAgent {
    pub(crate) destination: &'static str,
    pub(crate) table: &'static str,
    pub(crate) seed: u64,
    pub(crate) fail_rate: f64,
}

#[async_trait::async_trait]
impl Agent for BookingAgent {
    type Command = Booking;
    /// The reservation id (nothing useful for a cancellation).
    type Reply = String;

    fn destination(&self) -> &str {
        self.destination
    }

    async fn handle(&self, ctx: &mut AgentContext<'_>, cmd: Booking) -> Result<String, StepError> {
        let saga = ctx
            .saga_id()
            .map(|s| s.to_string())
            .ok_or_else(|| StepError::fatal("no saga id"))?;
        match cmd {
            Booking::Reserve { customer } => {
                let r = support::roll(self.seed, &ctx.message_id().to_string(), self.table);
                if r < self.fail_rate * 0.7 {
                    return Err(StepError::retryable(format!(
                        "{} service busy",
                        self.destination
                    )));
                }
                if r < self.fail_rate {
                    return Err(StepError::fatal(format!(
                        "no availability for customer {customer}"
                    )));
                }
                // Idempotent on the saga: a command sent again after a timeout finds
                // the row, books nothing twice, and answers the id booked first.
                let id = format!("{}-{}", self.destination, ctx.message_id());
                let sql = format!(
                    "INSERT INTO {} (saga_id, reservation_id, status) VALUES (?, ?, 'booked') ON CONFLICT (saga_id) DO NOTHING",
                    self.table
                );
                support::exec(ctx.conn(), &sql, &[&saga, &id]).await?;
                let sql = format!(
                    "SELECT reservation_id FROM {} WHERE saga_id = ?",
                    self.table
                );
                support::fetch_text(ctx.conn(), &sql, &[&saga])
                    .await?
                    .ok_or_else(|| StepError::retryable("the reservation vanished"))
            }
            Booking::Cancel {
                reservation_id: Some(id),
            } => {
                let sql = format!(
                    "UPDATE {} SET status = 'cancelled' WHERE reservation_id = ?",
                    self.table
                );
                support::exec(ctx.conn(), &sql, &[&id]).await?;
                Ok("cancelled".into())
            }
            Booking::Cancel {
                reservation_id: None,
            } => {
                // The reservation's outcome is unknown: whatever this saga booked here
                // goes (its command, if it ran at all, ran before this: they share an
                // ordering key). Nothing booked is success.
                let sql = format!(
                    "UPDATE {} SET status = 'cancelled' WHERE saga_id = ?",
                    self.table
                );
                support::exec(ctx.conn(), &sql, &[&saga]).await?;
                Ok("cancelled".into())
            }
        }
    }
}

/// `trip_cars`: the car rented from the rental company's API (an outside call, with
/// the step's idempotency key), then recorded, one row per saga as above.
pub(crate) struct CarRentalAgent {
    pub(crate) api: car_rental::Client,
    pub(crate) seed: u64,
    pub(crate) fail_rate: f64,
}

#[async_trait::async_trait]
impl CallingAgent for CarRentalAgent {
    type Command = Booking;
    /// The rental's id (nothing for a cancellation).
    type Output = Option<String>;
    type Reply = String;

    fn destination(&self) -> &str {
        "cars"
    }

    async fn call(&self, ctx: &CallContext<'_>, cmd: &Booking) -> Result<Self::Output, StepError> {
        let saga = ctx
            .saga_id()
            .map(|s| s.to_string())
            .ok_or_else(|| StepError::fatal("no saga id"))?;
        let key = ctx.idempotency_key();
        match cmd {
            Booking::Reserve { customer } => {
                let r = support::roll(self.seed, &ctx.message_id().to_string(), "trip_cars");
                if r < self.fail_rate * 0.7 {
                    return Err(StepError::retryable("cars service busy"));
                }
                if r < self.fail_rate {
                    return Err(StepError::fatal(format!(
                        "no availability for customer {customer}"
                    )));
                }
                self.api.reserve(&key, *customer, &saga).await.map(Some)
            }
            // The rental the step's reply named; none when its outcome is unknown: the
            // API then cancels whatever this saga rented, if anything.
            Booking::Cancel { reservation_id } => {
                self.api
                    .cancel(&key, &saga, reservation_id.as_deref())
                    .await?;
                Ok(None)
            }
        }
    }

    async fn record(
        &self,
        ctx: &mut AgentContext<'_>,
        cmd: Booking,
        rental: Option<String>,
    ) -> Result<String, StepError> {
        let saga = ctx
            .saga_id()
            .map(|s| s.to_string())
            .ok_or_else(|| StepError::fatal("no saga id"))?;
        match (cmd, rental) {
            (Booking::Reserve { .. }, Some(id)) => {
                // A command sent again finds the row (and the company, seeing the same
                // key, answered the same rental).
                support::exec(
                    ctx.conn(),
                    "INSERT INTO trip_cars (saga_id, reservation_id, status) VALUES (?, ?, 'booked') ON CONFLICT (saga_id) DO NOTHING",
                    &[&saga, &id],
                )
                .await?;
                support::fetch_text(
                    ctx.conn(),
                    "SELECT reservation_id FROM trip_cars WHERE saga_id = ?",
                    &[&saga],
                )
                .await?
                .ok_or_else(|| StepError::retryable("the rental vanished"))
            }
            (Booking::Reserve { .. }, None) => Err(StepError::fatal("the rental has no id")),
            (Booking::Cancel { .. }, _) => {
                support::exec(
                    ctx.conn(),
                    "UPDATE trip_cars SET status = 'cancelled' WHERE saga_id = ?",
                    &[&saga],
                )
                .await?;
                Ok("cancelled".into())
            }
        }
    }
}

pub(crate) const DDL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS trip_flights (saga_id TEXT PRIMARY KEY, reservation_id TEXT NOT NULL UNIQUE, status TEXT NOT NULL CHECK (status IN ('booked', 'cancelled')))",
    "CREATE TABLE IF NOT EXISTS trip_hotels (saga_id TEXT PRIMARY KEY, reservation_id TEXT NOT NULL UNIQUE, status TEXT NOT NULL CHECK (status IN ('booked', 'cancelled')))",
    "CREATE TABLE IF NOT EXISTS trip_cars (saga_id TEXT PRIMARY KEY, reservation_id TEXT NOT NULL UNIQUE, status TEXT NOT NULL CHECK (status IN ('booked', 'cancelled')))",
    "CREATE TABLE IF NOT EXISTS trip_payments (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status = 'charged'), amount_cents TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS trip_confirmations (saga_id TEXT PRIMARY KEY, status TEXT NOT NULL CHECK (status = 'sent'))",
];
