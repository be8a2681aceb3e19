//! Where the two schemas differ on purpose, and why.

/// Which side a fact is found on only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Only {
    Sqlite,
    Postgres,
}

/// Intended differences: (the side it is on, the fact, why).
pub(crate) const INTENDED: &[(Only, &str, &str)] = &[
    (
        Only::Postgres,
        "check outbox (lease_owner, state)",
        "0004_queue_plans: lease owner iff in flight, enforced for PostgreSQL's claim plans only",
    ),
    (
        Only::Postgres,
        "function agentsaga_claim",
        "0004_queue_plans: the claim planned without bitmap/seq scans; SQLite runs it inline",
    ),
    (
        Only::Postgres,
        "function agentsaga_count_finished",
        "0013_saga_finished_counts: a PostgreSQL trigger calls a function; SQLite's trigger holds its statement",
    ),
    (
        Only::Postgres,
        "function agentsaga_count_finished_truncate",
        "0013_saga_finished_counts: SQLite has no TRUNCATE (its DELETE fires saga_finished_delete)",
    ),
    (
        Only::Postgres,
        "trigger saga_instances.saga_finished_truncate",
        "0013_saga_finished_counts: SQLite has no TRUNCATE (its DELETE fires saga_finished_delete)",
    ),
    (
        Only::Postgres,
        "function agentsaga_ack_and_claim",
        "0004_queue_plans, 0006: acknowledge and claim in one round trip; SQLite has no round trips",
    ),
];
