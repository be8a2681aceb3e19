//! `agentsaga-runtime`: what users run. Agent actors carry out saga steps
//! effectively once; orchestrator actors drive the saga engine; a supervisor restarts
//! crashed actors; the relay delivers every message through the outbox.
//!
//! # Quick start
//!
//! ```
//! use agentsaga_runtime::{Agent, AgentContext, Runtime, StepError};
//! use agentsaga_saga::{Saga, SagaState, Step};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Order { id: u32 }
//!
//! struct Stock;
//! #[async_trait::async_trait]
//! impl Agent for Stock {
//!     type Command = serde_json::Value;
//!     type Reply = String;
//!     fn destination(&self) -> &str { "stock" }
//!     async fn handle(&self, ctx: &mut AgentContext<'_>, _cmd: serde_json::Value) -> Result<String, StepError> {
//!         // Effects go through ctx.conn(): the same transaction as the inbox record
//!         // and the reply.
//!         Ok(if ctx.is_compensation() { "released" } else { "reserved" }.into())
//!     }
//! }
//!
//! # #[cfg(feature = "sqlite")] // the example runs on an in-memory SQLite database
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let order = Saga::<Order>::builder("order", 1)
//!     .step(Step::new("reserve", "stock").compensate("stock", |o: &Order| o.id))
//!     .build()?;
//! let runtime = Runtime::builder()
//!     .database("sqlite::memory:")
//!     .agent(Stock)
//!     .saga(order)
//!     .start()
//!     .await?;
//! let id = runtime.start_saga("order", &Order { id: 1 }).await?;
//! assert_eq!(runtime.wait(id).await?, SagaState::Completed);
//! runtime.shutdown().await;
//! # Ok(()) }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

mod actors;
mod admission;
mod agent;
mod counts;
mod error;
mod faults;
pub mod metrics;
mod rate_limit;
#[cfg(feature = "nats")]
pub mod remote;
mod retention;
mod runtime;
mod schedules;
mod single;
mod stalled;
mod supervisor;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;

pub use agent::{Agent, AgentContext, CallContext, CallingAgent, ResultExt, StepError};
#[cfg(feature = "nats")]
pub use agentsaga_relay::nats::NatsConnect;
pub use error::{Error, Result};
pub use rate_limit::RateLimit;
#[cfg(feature = "nats")]
pub use remote::NatsLink;
pub use retention::Retention;
pub use runtime::{
    DEFAULT_AGENT_CONCURRENCY, DEFAULT_CALLING_CONCURRENCY, DEFAULT_DATABASE,
    DEFAULT_ORCHESTRATOR_CONCURRENCY, Runtime, RuntimeBuilder,
};
pub use schedules::Schedules;
