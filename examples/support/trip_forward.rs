//! The trip's forward agents of `examples/trip_booking.rs`: the payment (the pivot)
//! and the confirmation (after it).

use agentsaga::prelude::*;
use serde_json::{Value, json};

use super::{Trip, support};

/// `trip_payments`: the pivot. A declined card is fatal, before any charge.
pub(crate) struct PaymentAgent {
    pub(crate) seed: u64,
    pub(crate) fail_rate: f64,
}

#[async_trait::async_trait]
impl Agent for PaymentAgent {
    type Command = Trip;
    type Reply = Value;

    fn destination(&self) -> &str {
        "payments"
    }

    async fn handle(&self, ctx: &mut AgentContext<'_>, trip: Trip) -> Result<Value, StepError> {
        let saga = ctx
            .saga_id()
            .map(|s| s.to_string())
            .ok_or_else(|| StepError::fatal("no saga id"))?;
        if support::roll(self.seed, &saga, "payment") < self.fail_rate {
            return Err(StepError::fatal(format!(
                "card of customer {} declined",
                trip.customer
            )));
        }
        support::exec(
            ctx.conn(),
            "INSERT INTO trip_payments (saga_id, status, amount_cents) VALUES (?, 'charged', ?)
             ON CONFLICT (saga_id) DO NOTHING",
            &[&saga, &trip.amount_cents.to_string()],
        )
        .await?;
        Ok(json!({ "charged": trip.amount_cents }))
    }
}

/// `trip_confirmations`: after the pivot; a flaky mail server, retried until it works.
pub(crate) struct ConfirmationAgent {
    pub(crate) seed: u64,
    pub(crate) fail_rate: f64,
}

#[async_trait::async_trait]
impl Agent for ConfirmationAgent {
    type Command = Trip;
    type Reply = String;

    fn destination(&self) -> &str {
        "confirmations"
    }

    async fn handle(&self, ctx: &mut AgentContext<'_>, trip: Trip) -> Result<String, StepError> {
        let saga = ctx
            .saga_id()
            .map(|s| s.to_string())
            .ok_or_else(|| StepError::fatal("no saga id"))?;
        if support::roll(self.seed, &ctx.message_id().to_string(), "mail") < self.fail_rate {
            return Err(StepError::retryable("mail server unavailable"));
        }
        support::exec(
            ctx.conn(),
            "INSERT INTO trip_confirmations (saga_id, status) VALUES (?, 'sent') ON CONFLICT (saga_id) DO NOTHING",
            &[&saga],
        )
        .await?;
        Ok(format!("confirmation sent to customer {}", trip.customer))
    }
}
