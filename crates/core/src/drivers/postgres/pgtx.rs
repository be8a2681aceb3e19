//! PostgreSQL's write transaction as a [`Tx`](crate::Tx) holds it: sqlx's, with what a
//! hop of the set lane keeps in it. Declared apart from the code over it (`tx.rs`,
//! `driver.rs`) so that the store's handles, which hold it, import nothing that
//! imports them.

use super::kept::Kept;

/// PostgreSQL's write transaction (sqlx's), with what a hop of the set lane keeps in
/// it as data.
#[derive(Debug)]
pub(crate) struct PgTx {
    pub(crate) tx: sqlx::Transaction<'static, sqlx::Postgres>,
    /// The set lane's: what its hops keep as data, written at the batch's end.
    pub(crate) sets: Option<Kept>,
}
