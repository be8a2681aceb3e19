//! (feature `testing`) Moving a store's manual clock, the database's with it.

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
}
