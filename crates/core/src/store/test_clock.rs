//! (feature `testing`) Moving a store's manual clock, the database's with it; ending
//! the sessions of a process that a test killed.

impl crate::Store {
    /// (feature `testing`) Moves this store's [`ManualClock`](crate::clock::ManualClock)
    /// forward by `d`: first the database's own clock where it keeps one (PostgreSQL's
    /// `now()`), then the process's, which wakes what waits on it. On a system clock
    /// nothing moves.
    ///
    /// # Errors
    /// A database error moving the database's clock (the process's has not moved).
    pub async fn advance_clock(&self, d: std::time::Duration) -> crate::Result<()> {
        use crate::store::backend::Driver as _;
        if !self.clock().is_manual() {
            return Ok(());
        }
        let to = self
            .clock()
            .now_ms()
            .saturating_add(crate::clock::millis(d));
        crate::drivers::on_backend!(self.backend_ref(), b => b.set_clock(to).await)?;
        self.clock().advance_manual(d);
        Ok(())
    }

    /// (feature `testing`) Ends every other session of this store's database, as the
    /// death of a process ends its connections (PostgreSQL's server sessions, their
    /// transactions rolled back and their locks released; nothing on SQLite, whose
    /// locks die with their file handles). For a test that crashed a runtime on this
    /// database and starts the next one.
    ///
    /// # Errors
    /// A database error.
    pub async fn end_other_sessions(&self) -> crate::Result<()> {
        use crate::store::backend::Driver as _;
        crate::drivers::on_backend!(self.backend_ref(), b => b.end_other_sessions().await)
    }
}
