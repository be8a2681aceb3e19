//! SQLite's write transaction as a [`Tx`](crate::Tx) holds it: one of its own
//! (sqlx's), or the lane's on the writer it keeps, and a hop's deferred last write.
//! Declared apart from the code over it (`tx.rs`, `driver.rs`) so that the store's
//! handles, which hold it, import nothing that imports them.

use super::direct::LaneConn;
use super::tail::Tail;

/// SQLite's write transaction: one of its own (sqlx's), or the lane's, begun and ended
/// by hand on the writer it keeps; and a hop's deferred last write (its tail).
#[derive(Debug)]
pub(crate) struct SqliteTx {
    pub(crate) held: Held,
    /// A deferred last write, run by the lane in the round trip that ends the hop.
    pub(crate) tail: Option<Tail>,
}

#[derive(Debug)]
pub(crate) enum Held {
    Own(sqlx::Transaction<'static, sqlx::Sqlite>),
    /// The lane's: the writer connection, its transactions begun and ended by hand
    /// (statements run on it directly), kept by the lane from one batch to the next.
    Lane(LaneConn),
}
