//! PostgreSQL's side of [`Store::try_exclusive`](crate::Store::try_exclusive): a
//! session advisory lock on a connection of its own.

use sqlx::{Connection, PgConnection, PgPool};

use crate::Result;

/// The session holding a right.
#[derive(Debug)]
pub(crate) struct Session(PgConnection);

/// A connection out of `pool` holding the advisory lock of `name`, or `None` if another
/// session holds it.
pub(crate) async fn try_lock(pool: &PgPool, name: &str) -> Result<Option<Session>> {
    let mut conn = pool.acquire().await?.detach();
    let got: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_lock(hashtextextended('agentsaga.exclusive.' || $1, 0))",
    )
    .bind(name)
    .fetch_one(&mut conn)
    .await?;
    if got {
        Ok(Some(Session(conn)))
    } else {
        let _ = conn.close().await;
        Ok(None)
    }
}

impl Session {
    /// Whether the session answers (while it lives, it holds the lock).
    pub(crate) async fn still_held(&mut self) -> bool {
        self.0.ping().await.is_ok()
    }

    /// Releases the lock, then ends the session. The unlock is answered before this
    /// returns; the session's end alone is not (the server lets go of a closed
    /// session's locks a moment later, and the next holder's ask could come first).
    pub(crate) async fn release(mut self) {
        let _ = sqlx::query("SELECT pg_advisory_unlock_all()")
            .execute(&mut self.0)
            .await;
        let _ = self.0.close().await;
    }
}
