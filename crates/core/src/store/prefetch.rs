//! A read that a hop starts with ([`Prefetch`]), and what it read ([`Prefetched`]).

use super::read::{Load, Loaded};

/// A read that a hop starts with: a [`Load`] of one key, which the driver runs as its
/// lane allows. On SQLite it runs in the round trip that opens the hop (its savepoint
/// and inbox record) instead of a round trip of its own; on PostgreSQL it sends the
/// hop to a set lane (see
/// [`Store::hop_receiving_prefetched`](crate::Store::hop_receiving_prefetched)), which
/// reads it for all the hops of its batch at once. It reads the database as the hop
/// finds it when it opens: a hop that writes the rows it prefetched must read them
/// again.
#[derive(Debug, Clone, Copy)]
pub struct Prefetch {
    pub(crate) load: &'static Load,
    pub(crate) key: uuid::Uuid,
}

impl Prefetch {
    /// A read of `load` for `key`.
    pub fn load(load: &'static Load, key: uuid::Uuid) -> Self {
        Self { load, key }
    }
}

/// What a [`Prefetch`] read when its hop opened, the same on every driver.
#[derive(Default)]
pub struct Prefetched {
    pub(crate) loaded: Option<Loaded>,
}

impl std::fmt::Debug for Prefetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetched").finish_non_exhaustive()
    }
}

impl Prefetched {
    /// What was read: `None` if the key has no row.
    pub fn loaded(&self) -> Option<&Loaded> {
        self.loaded.as_ref()
    }
}
