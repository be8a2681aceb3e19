//! A read that a hop starts with ([`Prefetch`]), and the rows it read
//! ([`Prefetched`]).

use super::row::Row;

/// A read that a hop starts with, run (on SQLite) in the round trip that opens the hop
/// (its savepoint and inbox record) instead of a round trip of its own: the hop's
/// first statements and the read are one hand-off to the connection's thread.
///
/// The SQL is one statement whose parameters are plain `?`s (no numbers: the round trip
/// holds other statements' parameters too), bound as text in the order of
/// [`bind`](Self::bind); a `?` inside a string literal is taken for one, so write none.
/// It reads the database as the hop finds it when it opens: a hop that writes the rows
/// it prefetched must read them again. On PostgreSQL only the set form
/// ([`with_set`](Self::with_set)) is read, by the set lane; without it the hop reads
/// for itself.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))] // read by SQLite alone
pub struct Prefetch {
    pub(crate) sql: String,
    pub(crate) binds: Vec<String>,
    /// PostgreSQL's set lane: the key, and statements that read all the batch's keys
    /// at once.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) set: Option<(uuid::Uuid, &'static [&'static str])>,
}

impl Prefetch {
    /// A read of `sql` (one statement, parameters `?`).
    pub fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            binds: Vec::new(),
            set: None,
        }
    }

    /// The same read for PostgreSQL's set lane (see
    /// [`Store::hop_receiving_prefetched`](crate::Store::hop_receiving_prefetched)): `statements` run once for all the keys of
    /// a batch, in order, each with one parameter, the keys as `uuid[]` (`= ANY($1)`),
    /// each returning its rows with their key in a column `prefetch_key`. A hop gets
    /// the rows of its `key` ([`Prefetched::rows`]). Without it, a hop on
    /// PostgreSQL reads for itself.
    #[must_use]
    pub fn with_set(mut self, key: uuid::Uuid, statements: &'static [&'static str]) -> Self {
        self.set = Some((key, statements));
        self
    }

    /// Binds the next parameter, as text.
    #[must_use]
    pub fn bind(mut self, value: impl Into<String>) -> Self {
        self.binds.push(value.into());
        self
    }
}

/// The rows a [`Prefetch`] read when its hop opened, the same on every backend.
#[derive(Default)]
pub struct Prefetched {
    /// Per statement of the read, its rows (for this hop's key, on the set lane).
    pub(crate) rows: Vec<Vec<Row>>,
}

impl std::fmt::Debug for Prefetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetched").finish_non_exhaustive()
    }
}

impl Prefetched {
    /// What a hop's opening read of one statement returned (SQLite).
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn of_rows(rows: Vec<Row>) -> Self {
        Self { rows: vec![rows] }
    }

    /// The rows read, per statement of the read, in order: one statement for the read
    /// that opened a hop in its round trip (SQLite's lane, [`Prefetch::new`]), one per
    /// set statement for a hop of PostgreSQL's set lane ([`Prefetch::with_set`], the
    /// rows of this hop's key); none if nothing was read.
    pub fn rows(&self) -> &[Vec<Row>] {
        &self.rows
    }
}
