//! `agentsaga-relay`: the outbox relay. It moves committed messages from the `outbox`
//! table (written by `agentsaga-core` in the producer's transaction) to their
//! destinations, and records what happened to each.
//!
//! - A claimer actor claims ready rows in batches ([`Queue::claim`](agentsaga_core::queue::Queue::claim)) while fewer than
//!   `workers + batch_size` are in flight (a batch queues behind busy workers) — on a wakeup from the store, on a poll tick, or when a worker
//!   finishes — and leases them to this relay.
//! - A pool of delivery workers (a `ractor` factory with key-affine routing) hands each
//!   envelope to a [`Transport`]: [`in_process::InProcessTransport`] for actors in this
//!   process, `http::HttpTransport` for another process (which serves
//!   `http::router` and stores what it receives in its own database; feature `http`),
//!   or your own. `nats::NatsTransport` publishes to a NATS JetStream stream, and
//!   `nats::NatsReceiver` consumes it into another service's own database (feature
//!   `nats`).
//! - Outcomes are written back in batches: [`Delivery::Delivered`] marks the row
//!   delivered; [`Delivery::Retry`] schedules another attempt with backoff until the
//!   [`RetryPolicy`](agentsaga_core::RetryPolicy) budget is spent; [`Delivery::Reject`]
//!   and spent budgets dead-letter the row, sending a `DeliveryFailed` notice to its
//!   `reply_to`.
//! - Per-key order comes from the claim query (one row per key in flight, in enqueue
//!   order); a per-destination circuit breaker pauses a destination that keeps failing;
//!   leases of long deliveries are renewed and expired ones (a dead relay's) reclaimed.
//! - Database errors never stop a relay: they are logged and retried with backoff.
//!
//! `agentsaga-runtime` starts a relay next to the saga engine; several relays (in one
//! or many processes) can share a PostgreSQL outbox.
//!
//! # Quick start
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use agentsaga_core::{Message, Store};
//! use agentsaga_relay::in_process::{Deliver, InProcessTransport};
//! use agentsaga_relay::{Delivery, Relay, RelayConfig};
//! use ractor::{Actor, ActorProcessingErr, ActorRef};
//!
//! /// A destination actor: answers every delivery.
//! struct Billing;
//!
//! impl Actor for Billing {
//!     type Msg = Deliver;
//!     type State = ();
//!     type Arguments = ();
//!     async fn pre_start(&self, _: ActorRef<Deliver>, _: ()) -> Result<(), ActorProcessingErr> {
//!         Ok(())
//!     }
//!     async fn handle(&self, _: ActorRef<Deliver>, msg: Deliver, _: &mut ()) -> Result<(), ActorProcessingErr> {
//!         println!("billing got {}", msg.envelope.payload);
//!         let _ = msg.reply.send(Delivery::Delivered);
//!         Ok(())
//!     }
//! }
//!
//! # #[cfg(feature = "sqlite")] // the example runs on an in-memory SQLite database
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Store::connect("sqlite::memory:").await?;
//! let transport = InProcessTransport::new();
//! let (billing, _) = Actor::spawn(None, Billing, ()).await?;
//! transport.register("billing", billing);
//!
//! let relay = Relay::start(
//!     store.clone(),
//!     vec!["billing".to_string()],
//!     Arc::new(transport),
//!     RelayConfig::default(),
//! )
//! .await?;
//!
//! let mut tx = store.begin().await?;
//! tx.enqueue(&Message::to("billing").key("order-7").json(&serde_json::json!({"amount": 42}))?).await?;
//! tx.commit().await?; // wakes the relay
//!
//! # let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
//! while relay.stats().delivered < 1 {
//!     # assert!(tokio::time::Instant::now() < deadline, "not delivered");
//!     tokio::time::sleep(Duration::from_millis(10)).await;
//! }
//! assert_eq!(store.admin().stats().await?.delivered, 1);
//! relay.shutdown().await;
//! # Ok(()) }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

mod backoff;
mod breaker;
mod claimer;
mod config;
mod error;
mod handover;
#[cfg(feature = "http")]
pub mod http;
pub mod in_process;
pub mod lease;
#[cfg(feature = "nats")]
pub mod nats;
mod outcomes;
mod pacer;
#[cfg(any(feature = "http", feature = "nats"))]
mod received;
mod relay;
mod stats;
mod transport;
mod worker;

pub use config::RelayConfig;
pub use error::{Error, Result};
pub use relay::Relay;
pub use stats::RelayStats;
pub use transport::{Delivery, Transport};

#[cfg(doc)]
use agentsaga_core::Store;
