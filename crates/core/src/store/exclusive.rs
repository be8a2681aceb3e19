//! A right over the database that one holder has at a time, by name
//! ([`Store::try_exclusive`]): for work that processes sharing a database must not do
//! side by side, such as consuming one NATS destination in order.
//!
//! - PostgreSQL: a session advisory lock (`pg_try_advisory_lock`) on a connection of
//!   its own, taken out of the pool. The server releases it when that session ends: on
//!   [`Exclusive::release`], on drop, or when the holder's process dies or loses the
//!   connection. [`Exclusive::still_held`] asks that session whether it is alive.
//! - SQLite: a lock (`flock`) on a file beside the database,
//!   `<database>-<name>.lock`. The system releases it with the file: on release, on
//!   drop, or when the process dies. An in-memory database has one process: the right
//!   is kept by the store, and two holders of one name in it are refused as well.

use super::backend::Driver;
use super::types::Store;
use crate::drivers::{HoldOf, on_backend};
use crate::{Error, Result};

/// A right held exclusively while it lives ([`Store::try_exclusive`]): on PostgreSQL a
/// session advisory lock on a connection of its own, released when that session ends
/// (on [`release`](Self::release), on drop, or with the holder's process or
/// connection); on SQLite a lock on the file `<database>-<name>.lock` beside the
/// database, released with the file (on release, on drop, or when the process dies).
#[derive(Debug)]
pub struct Exclusive {
    name: String,
    hold: HoldOf,
}

impl Store {
    /// Takes the right named `name` (letters, digits, `.`, `_`, `-`; at most 200) if no
    /// one holds it, in this process or another of the database: `None` if someone
    /// does.
    ///
    /// # Errors
    /// [`Error::Exclusive`] for a name outside those characters or a lock file that
    /// cannot be opened; a database error if PostgreSQL cannot be asked.
    pub async fn try_exclusive(&self, name: &str) -> Result<Option<Exclusive>> {
        if name.is_empty()
            || name.len() > 200
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(Error::Exclusive {
                name: name.to_owned(),
                reason: "a name is 1 to 200 letters, digits, `.`, `_` or `-`".into(),
            });
        }
        let hold = on_backend!(&self.backend, b => b.try_exclusive(self, name).await?);
        Ok(hold.map(|hold| Exclusive {
            name: name.to_owned(),
            hold,
        }))
    }
}

impl Exclusive {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether it is still held: on PostgreSQL, whether its session answers (a lost
    /// session has released it, and another may hold it now); elsewhere always, while
    /// the process lives.
    pub async fn still_held(&mut self) -> bool {
        crate::drivers::on_hold!(&mut self.hold, h => h.still_held().await)
    }

    /// Lets it go now (dropping it does too; on PostgreSQL this also waits for the
    /// session's end).
    pub async fn release(self) {
        crate::drivers::on_hold!(self.hold, h => h.release().await);
    }
}
