-- How many sagas are finished, per final state, kept by the database itself so that
-- the overview (`agentsaga status`, the console, MCP) reads a few rows instead of
-- counting every saga ever kept (issue 31: under 50 ms at a million finished sagas).
--
-- Triggers keep the counts whatever writes saga_instances (the runtime, `prune`, an
-- operator's own DELETE or TRUNCATE): a saga entering a final state adds one, leaving
-- it (it does not, today) or being deleted takes one away, in the transaction that
-- changes the saga, so the sums are exact at every commit.
--
-- On PostgreSQL a change is a row appended to saga_finished_deltas, not an update of
-- a counter: appends take no lock another transaction waits on (concurrent writers
-- never queue on, or deadlock over, a counter row), and a statement that finishes or
-- deletes a million sagas appends a million small rows (an update of one row a million
-- times in one transaction would walk an ever longer chain of its versions). The
-- reader sums saga_finished_counts and the deltas; the runtime folds the deltas into
-- saga_finished_counts every few seconds, and so does `prune` after it deletes
-- (`agentsaga_saga::query::fold_finished_counts`). SQLite has one writer and updates
-- its counter row directly (its 0013).
CREATE TABLE saga_finished_counts (
    shard       INTEGER PRIMARY KEY,
    completed   BIGINT  NOT NULL DEFAULT 0,
    compensated BIGINT  NOT NULL DEFAULT 0,
    aborted     BIGINT  NOT NULL DEFAULT 0
);

CREATE TABLE saga_finished_deltas (
    completed   BIGINT  NOT NULL,
    compensated BIGINT  NOT NULL,
    aborted     BIGINT  NOT NULL
);

CREATE FUNCTION agentsaga_count_finished() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    c bigint := 0;
    p bigint := 0;
    a bigint := 0;
BEGIN
    IF TG_OP = 'UPDATE' OR TG_OP = 'DELETE' THEN
        c := c - (OLD.state = 'completed')::int;
        p := p - (OLD.state = 'compensated')::int;
        a := a - (OLD.state = 'aborted')::int;
    END IF;
    IF TG_OP = 'UPDATE' OR TG_OP = 'INSERT' THEN
        c := c + (NEW.state = 'completed')::int;
        p := p + (NEW.state = 'compensated')::int;
        a := a + (NEW.state = 'aborted')::int;
    END IF;
    INSERT INTO saga_finished_deltas (completed, compensated, aborted) VALUES (c, p, a);
    RETURN NULL;
END
$$;

CREATE FUNCTION agentsaga_count_finished_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM saga_finished_deltas;
    UPDATE saga_finished_counts SET completed = 0, compensated = 0, aborted = 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER saga_finished_insert AFTER INSERT ON saga_instances FOR EACH ROW
WHEN (NEW.state IN ('completed', 'compensated', 'aborted'))
EXECUTE FUNCTION agentsaga_count_finished();

CREATE TRIGGER saga_finished_update AFTER UPDATE OF state ON saga_instances FOR EACH ROW
WHEN (OLD.state IS DISTINCT FROM NEW.state
      AND (OLD.state IN ('completed', 'compensated', 'aborted')
           OR NEW.state IN ('completed', 'compensated', 'aborted')))
EXECUTE FUNCTION agentsaga_count_finished();

CREATE TRIGGER saga_finished_delete AFTER DELETE ON saga_instances FOR EACH ROW
WHEN (OLD.state IN ('completed', 'compensated', 'aborted'))
EXECUTE FUNCTION agentsaga_count_finished();

CREATE TRIGGER saga_finished_truncate AFTER TRUNCATE ON saga_instances FOR EACH STATEMENT
EXECUTE FUNCTION agentsaga_count_finished_truncate();

-- The sagas finished before this migration, counted after the triggers exist: creating
-- a trigger locks saga_instances against writes until this migration commits, so no
-- saga finishes between the count and the triggers.
INSERT INTO saga_finished_counts (shard, completed, compensated, aborted)
SELECT 0,
       count(*) FILTER (WHERE state = 'completed'),
       count(*) FILTER (WHERE state = 'compensated'),
       count(*) FILTER (WHERE state = 'aborted')
FROM saga_instances;
