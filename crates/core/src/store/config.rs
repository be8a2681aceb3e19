//! Store configuration.

use std::time::Duration;

use crate::clock::Clock;

/// SQLite's `synchronous` setting: how much a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Durable across process crashes (`kill -9`); the last commits may be lost on
    /// power loss. The default.
    #[default]
    Normal,
    /// Durable across power loss, at a few times the cost per commit.
    Full,
}

/// How a [`Store`](crate::Store) is opened and what it accepts.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreConfig {
    /// Largest message (payload + headers) `enqueue` accepts. Default 1 MiB.
    pub max_message_bytes: usize,
    /// Backpressure: past this many pending rows, `enqueue` fails with `QueueFull`.
    /// Default: no limit. Counting costs up to this many index entries per enqueue.
    /// The limit holds under concurrency: on SQLite writers already take turns; on
    /// PostgreSQL each enqueuing transaction takes an advisory lock before it counts,
    /// held until it ends, so enqueuing transactions take turns too (a cost in
    /// throughput that only a configured limit pays).
    pub max_pending: Option<u64>,
    /// SQLite durability. Default [`Synchronous::Normal`].
    pub synchronous: Synchronous,
    /// How long SQLite waits for another process's write lock. Default 10 s.
    pub busy_timeout: Duration,
    /// PostgreSQL pool size, and SQLite reader pool size. Default 16.
    pub max_connections: u32,
    /// How long to wait for a pooled connection (SQLite writers queue here). Default 60 s.
    pub acquire_timeout: Duration,
    /// PostgreSQL: run the hops that apply an answer to a saga of this process in
    /// shared transactions whose statements each serve all their hops (the set lane,
    /// see [`Store::hop_receiving_prefetched`](crate::Store::hop_receiving_prefetched)).
    /// Default `true`; `false` gives each such hop a transaction of its own. Not used
    /// with a [`max_pending`](Self::max_pending) limit.
    pub set_lane: bool,
    /// The lanes' watchdog: how long a hop may hold its turn in a shared transaction
    /// (from when it gets it to when it commits or rolls back). Past it the hop fails
    /// alone: nothing of it is written, and its commit (whenever it comes) fails with
    /// [`Error::SharedCommit`](crate::Error::SharedCommit). On PostgreSQL's set lane
    /// the lane ends the hop's transaction (terminating its session), fails the hops
    /// its batch kept before it (transient, retried by their callers) and goes on with
    /// the rest. SQLite's lane cannot take its single writer back from a holder that
    /// never returns: it waits (and logs an error), then undoes the hop when it comes
    /// back; the hops behind it go on. Default 30 s.
    pub hop_timeout: Duration,
    /// The runtime's one clock (see [`crate::clock`]). Default [`Clock::system`]. A
    /// manual clock (feature `testing`) on PostgreSQL is installed in the database
    /// (a fresh one: see [`crate::clock`]).
    pub clock: Clock,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: 1024 * 1024,
            max_pending: None,
            synchronous: Synchronous::Normal,
            busy_timeout: Duration::from_secs(10),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(60),
            set_lane: true,
            hop_timeout: Duration::from_secs(30),
            clock: Clock::system(),
        }
    }
}

impl StoreConfig {
    /// Sets [`max_message_bytes`](Self::max_message_bytes).
    #[must_use]
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    /// Sets [`set_lane`](Self::set_lane).
    #[must_use]
    pub fn set_lane(mut self, on: bool) -> Self {
        self.set_lane = on;
        self
    }

    /// Sets [`clock`](Self::clock).
    #[must_use]
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Sets [`hop_timeout`](Self::hop_timeout).
    #[must_use]
    pub fn hop_timeout(mut self, bound: Duration) -> Self {
        self.hop_timeout = bound;
        self
    }

    /// Sets [`max_pending`](Self::max_pending).
    #[must_use]
    pub fn max_pending(mut self, limit: Option<u64>) -> Self {
        self.max_pending = limit;
        self
    }

    /// Sets [`synchronous`](Self::synchronous).
    #[must_use]
    pub fn synchronous(mut self, s: Synchronous) -> Self {
        self.synchronous = s;
        self
    }

    /// Sets [`busy_timeout`](Self::busy_timeout).
    #[must_use]
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Sets [`acquire_timeout`](Self::acquire_timeout).
    #[must_use]
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Sets [`max_connections`](Self::max_connections).
    #[must_use]
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }
}
