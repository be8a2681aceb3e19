//! A message written straight into the dead letters: a receiving side that took a
//! message it cannot deliver (a transport's consumer) keeps it, with its reason, where
//! the operator looks ([`Admin::dead_letters`](crate::admin::Admin::dead_letters)),
//! in the same transaction as the good messages of its batch.

use crate::drivers::on_conn;
use crate::store::backend::Dialect;
use crate::{Message, Result, Tx};

impl Tx {
    /// Writes `message` as a dead letter with `reason` (its `last_error`), in this
    /// transaction: never delivered, listed and re-driven as any dead letter. A message
    /// whose id is already stored is not written again (as [`enqueue`](Self::enqueue)):
    /// returns whether it was written. It skips the pending limit (a dead letter is
    /// not pending) and wakes no relay; the message's delay is ignored.
    ///
    /// # Errors
    /// As [`enqueue`](Self::enqueue) for a message the store does not take
    /// ([`Error::EmptyDestination`](crate::Error::EmptyDestination),
    /// [`Error::PayloadTooLarge`](crate::Error::PayloadTooLarge),
    /// [`Error::Json`](crate::Error::Json)), nothing written;
    /// [`Error::Database`](crate::Error::Database) on a database error.
    pub async fn enqueue_dead(&mut self, message: &Message, reason: &str) -> Result<bool> {
        self.store().validate(message)?;
        let now = self.store().clock().now_ms();
        let r =
            on_conn!(self.conn_marked().0, D, c => D::enqueue_dead(c, message, reason, now).await);
        self.suspect(r)
    }
}
