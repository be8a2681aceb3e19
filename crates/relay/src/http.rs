//! The HTTP transport: two agentsaga processes with two databases hand messages to
//! each other over plain HTTP.
//!
//! - The sending side's relay uses [`HttpTransport`]: it POSTs each envelope, as JSON,
//!   to the URL configured for its destination, with `Authorization: Bearer <token>`.
//!   A 2xx answer means delivered; a 4xx a permanent reject (the row is dead-lettered),
//!   except 408 and 429; a 5xx, 408, 429, a timeout or a refused connection a retry
//!   (honouring `Retry-After` in seconds on 429 and 503).
//! - The receiving side serves [`router`]: `POST /outbox` ([`OUTBOX_PATH`]) checks the
//!   bearer token, caps the body size, decodes and validates the envelope, and enqueues
//!   it — same id, key, payload and headers — into its **own** outbox in one
//!   transaction before answering `204 No Content`. Enqueueing an id that is already
//!   stored is a no-op, so a redelivery (the sender's relay retrying after a lost
//!   answer) is stored once: the inbox dedupe is on the message id. The receiving
//!   process's own relay then delivers the message to its local destination, under the
//!   same destination name.
//!
//! Both ends must have their own database: a receiver writing into the sender's store
//! would find the id already there and drop the message.
//!
//! Plain `http://` only: this crate builds `reqwest` without any TLS feature. Put the
//! receiver behind a TLS-terminating proxy, or on a private network, when the traffic
//! leaves the host. The bearer token is then the only authentication.
//!
//! # Wiring two stores
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use agentsaga_core::{Message, Store};
//! use agentsaga_relay::http::{self, HttpTransport, ReceiverConfig};
//! use agentsaga_relay::{Relay, RelayConfig};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Process B (billing) receives "billing" messages into its own outbox ...
//! let billing_db = Store::connect("postgres://postgres@billing-db/agentsaga").await?;
//! let app = http::router(
//!     billing_db.clone(),
//!     ReceiverConfig::new("s3cret").destinations(["billing"]),
//! )?;
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
//! tokio::spawn(async move { axum::serve(listener, app).await });
//! // ... and its own relay (with the in-process transport) hands them to its actors.
//!
//! // Process A (orders) sends its "billing" messages to B.
//! let orders_db = Store::connect("postgres://postgres@orders-db/agentsaga").await?;
//! let transport = HttpTransport::new("s3cret").route("billing", "http://billing:8080/outbox");
//! let relay = Relay::start(
//!     orders_db.clone(),
//!     transport.destinations(),
//!     Arc::new(transport),
//!     RelayConfig::default(),
//! )
//! .await?;
//!
//! let mut tx = orders_db.begin().await?;
//! tx.enqueue(&Message::to("billing").key("order-7").json(&serde_json::json!({"charge": 42}))?)
//!     .await?;
//! tx.commit().await?; // A's relay POSTs it to B once committed
//! # relay.shutdown().await;
//! # Ok(()) }
//! ```

mod client;
mod receiver;

pub use client::HttpTransport;
pub use receiver::{OUTBOX_PATH, ReceiverConfig, router};
