//! `agentsaga`: sagas run by actors, over a transactional outbox that lives in your
//! own database (SQLite embedded, or PostgreSQL for many processes).
//!
//! This facade re-exports the crates and offers a [`prelude`]:
//! - [`core`]: the outbox, the inbox and the store backends;
//! - [`saga`]: saga definitions and the persisted state machine;
//! - [`relay`]: the actor pool that delivers the outbox;
//! - [`runtime`]: agents, orchestrators, supervision and the `Runtime` builder.
//!
//! Start with `examples/trip_booking.rs`, and `docs/ARCHITECTURE.md`.

/// The operator console (`agentsaga::console::http::HttpConfig` for
/// `Runtime::admin_router`).
#[cfg(feature = "console")]
pub use agentsaga_console as console;
pub use agentsaga_core as core;
pub use agentsaga_relay as relay;
pub use agentsaga_runtime as runtime;
pub use agentsaga_saga as saga;

/// (feature `testing`) Sagas under test in milliseconds: see
/// [`runtime::testing::TestRuntime`].
#[cfg(feature = "testing")]
pub use agentsaga_runtime::testing;

/// The names most programs need.
pub mod prelude {
    pub use agentsaga_core::{Conn, Message, MessageId, RetryPolicy, Store, StoreConfig, Tx};
    pub use agentsaga_relay::RelayConfig;
    pub use agentsaga_runtime::{
        Agent, AgentContext, CallContext, CallingAgent, RateLimit, ResultExt, Runtime, StepError,
    };
    pub use agentsaga_saga::{
        Budget, OnBudgetSpent, Plan, PlanStart, PlanStep, PlannedSaga, Saga, SagaId, SagaState,
        Signal, Step, StepOutcome, Usage,
    };
}
