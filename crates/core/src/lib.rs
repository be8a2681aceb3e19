//! `agentsaga-core`: the transactional outbox and inbox that every agentsaga hop goes
//! through, on SQLite (embedded, the default) and PostgreSQL (many processes).
//!
//! - A [`Message`] is written to the `outbox` table *in the caller's transaction*
//!   ([`Store::enqueue`], [`Tx::enqueue`]): it exists exactly when the business change
//!   that caused it commits.
//! - The relay (`agentsaga-relay`) claims ready rows in batches ([`queue::Queue::claim`]),
//!   delivers them, and acknowledges them ([`queue::Queue::mark_delivered`]), retries
//!   them ([`queue::Queue::retry_later`]) or dead-letters them
//!   ([`queue::Queue::dead_letter`]). Rows that share a key are delivered one at a time,
//!   in order. That protocol lives in [`queue`], reached through [`Store::queue`].
//! - Operators count, re-drive and prune through [`admin`] ([`Store::admin`]).
//! - A consumer records each message id in the `inbox` table in the same transaction as
//!   its effects ([`Store::receive`]): a redelivered duplicate is recognised and skipped.
//!
//! No actors here: `agentsaga-saga`, `agentsaga-relay` and `agentsaga-runtime` build on
//! this crate.
//!
//! # Quick start
//!
//! ```
//! use agentsaga_core::{Message, Receipt, Store, queue::Claim};
//! use std::time::Duration;
//!
//! # #[cfg(feature = "sqlite")] // the example runs on an in-memory SQLite database
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), agentsaga_core::Error> {
//! let store = Store::connect("sqlite::memory:").await?;
//!
//! // The producer: business change and message, one transaction.
//! let mut tx = store.begin().await?;
//! let msg = Message::to("billing").key("order-7").json(&serde_json::json!({"amount": 42}))?;
//! tx.enqueue(&msg).await?;
//! tx.commit().await?;
//!
//! // The relay: claim, deliver, acknowledge.
//! let destinations = vec!["billing".to_string()];
//! let claim = Claim { owner: "relay-1", destinations: &destinations, limit: 100, lease: Duration::from_secs(30) };
//! let batch = store.queue().claim(&claim).await?;
//! assert_eq!(batch.len(), 1);
//!
//! // The consumer: effectively once.
//! let mut tx = store.begin().await?;
//! assert_eq!(tx.receive("billing", batch[0].id).await?, Receipt::First);
//! tx.commit().await?;
//! let mut tx = store.begin().await?;
//! assert_eq!(tx.receive("billing", batch[0].id).await?, Receipt::Duplicate);
//! tx.rollback().await?;
//!
//! store.queue().mark_delivered("relay-1", &[batch[0].seq]).await?;
//! assert_eq!(store.admin().stats().await?.delivered, 1);
//! # Ok(()) }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

pub mod clock;
mod drivers;
mod error;
mod id;
mod message;
pub mod propagation;
pub mod redact;
mod retry;
mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::{Error, Result};
pub use id::MessageId;
pub use message::{DeliveryFailed, Envelope, Headers, Message, header};
pub use retry::RetryPolicy;
pub(crate) use store::Integer;
pub use store::{
    Conn, Exclusive, Hop, HopStats, ReadPool, Receipt, Row, Sql, Store, StoreConfig, Synchronous,
    Tx, admin, queue, read, sql, write,
};

pub use drivers::migrate;

/// Direct handover: a relay in this process takes the messages a transaction writes
/// as they commit, leased to it, instead of claiming them (see
/// [`Store::install_handover`]).
pub mod handover {
    pub use crate::store::{Handover, Installed};
}

/// Re-exported so users name the same sqlx the store was built with.
pub use sqlx;
