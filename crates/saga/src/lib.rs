//! `agentsaga-saga`: sagas defined in Rust, their persisted state machine, and the
//! compensation ledger. No actors: `agentsaga-runtime` drives this engine with the
//! relay's deliveries.
//!
//! A saga is a name, a version, a typed data struct and ordered steps. Each step
//! dispatches a command to an agent and folds the agent's reply back into the data.
//! Before the *pivot* (the point of no return) every step names its compensation,
//! which is written to the ledger in the same transaction that dispatches the step;
//! after the pivot, steps are retried forward until they succeed. When a step fails
//! before the pivot, the compensations of the steps taken run strictly in reverse.
//!
//! # Quick start
//!
//! ```
//! use agentsaga_saga::{Engine, Saga, Step};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Trip { id: u32, flight: Option<String> }
//!
//! # fn main() -> Result<(), agentsaga_saga::Error> {
//! let trip = Saga::<Trip>::builder("trip", 1)
//!     .step(
//!         Step::new("reserve_flight", "flights")
//!             .command(|t: &Trip| serde_json::json!({ "reserve": t.id }))
//!             .on_reply(|t: &mut Trip, booking: String| t.flight = Some(booking))
//!             .compensate("flights", |t: &Trip| serde_json::json!({ "cancel": t.id })),
//!     )
//!     .pivot(Step::new("charge", "payments").command(|t: &Trip| t.id))
//!     .step(Step::new("confirm", "email").command(|t: &Trip| t.id))
//!     .build()?;
//! let engine = Engine::new([trip])?;
//! assert_eq!(engine.orchestrator_destinations(), vec!["saga.trip.child", "saga.trip.v1"]);
//! // engine.start(&mut tx, "trip", &Trip { id: 7, flight: None }).await? — in a store
//! // transaction; then engine.handle(&mut tx, &envelope) for every reply.
//! # Ok(()) }
//! ```

mod budget;
mod definition;
mod engine;
mod error;
mod id;
mod pause;
pub mod plan;
pub mod protocol;
pub mod query;
mod rewind;
pub mod schedule;
mod state;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use budget::{Budget, OnBudgetSpent, Usage};
pub use definition::{
    AfterPivot, BeforePivot, Open, PlannedBuilder, PlannedSaga, Saga, SagaBuilder, SagaDefinition,
    Step, StepDef, Undoable, child_destination, orchestrator_destination,
};
pub use engine::{
    Accepted, DEFAULT_MAX_CHILD_DEPTH, DEFAULT_MAX_CHILDREN, DEFAULT_MAX_IN_FLIGHT, Engine,
    Handled, MAX_KEY_BYTES, SetAsideStart, Signal, SignalReceipt, SignalSender,
};
pub use error::{Error, Result};
pub use id::SagaId;
pub use pause::Paused;
pub use plan::{Plan, PlanCommand, PlanStage, PlanStart, PlanStep};
pub use protocol::StepOutcome;
pub use rewind::{Rewind, UndoneStep};
pub use state::{CompensationState, SagaEvent, SagaState, StepState};

#[cfg(test)]
mod tests;
