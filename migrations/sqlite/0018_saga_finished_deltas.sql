-- The same tables as PostgreSQL's, so that the statements that read and fold the
-- finished counts are the same on every backend. SQLite's single writer updates its
-- counter row directly (its 0013): nothing appends here, the table stays empty, and
-- a fold finds nothing to do.
CREATE TABLE saga_finished_deltas (
    id          INTEGER PRIMARY KEY,
    completed   BIGINT  NOT NULL,
    compensated BIGINT  NOT NULL,
    aborted     BIGINT  NOT NULL
);
