//! (feature `testing`) A builder made ready for `testing::TestRuntime`.

use std::sync::Arc;

use agentsaga_core::clock::Clock;

use super::RuntimeBuilder;
use crate::faults::Faults;

impl RuntimeBuilder {
    /// On the database at `url`, its store's clock `clock` (the rest of its store
    /// configuration kept; a store given before is dropped), its agents taking
    /// `faults` (and keeping their journal): a restarted test runtime passes on the
    /// first one's.
    pub(crate) fn under_test(mut self, url: String, clock: Clock, faults: Arc<Faults>) -> Self {
        (self.url, self.store, self.faults) = (Some(url), None, faults);
        self.store_config = self.store_config.clock(clock);
        self
    }
}
