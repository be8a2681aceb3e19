-- How many sagas are finished, per final state, kept by the database itself so that
-- the overview (`agentsaga status`, the console, MCP) reads a few rows instead of
-- counting every saga ever kept (issue 31: under 50 ms at a million finished sagas).
--
-- Triggers keep the counts whatever writes saga_instances (the runtime, `prune`, an
-- operator's own DELETE or TRUNCATE): a saga entering a final state adds one, leaving
-- it (it does not, today) or being deleted takes one away, in the transaction that
-- changes the saga, so the sums are exact at every commit. The counts are spread over
-- 128 shards, one per server process (`pg_backend_pid() % 128`): concurrent
-- transactions of different connections update different rows, so finishing sagas on
-- many connections does not queue on one row lock. The reader sums the shards.
CREATE TABLE saga_finished_counts (
    shard       INTEGER PRIMARY KEY,
    completed   BIGINT  NOT NULL DEFAULT 0,
    compensated BIGINT  NOT NULL DEFAULT 0,
    aborted     BIGINT  NOT NULL DEFAULT 0
);

INSERT INTO saga_finished_counts (shard) SELECT generate_series(0, 127);

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
    UPDATE saga_finished_counts
    SET completed = completed + c, compensated = compensated + p, aborted = aborted + a
    WHERE shard = pg_backend_pid() % 128;
    RETURN NULL;
END
$$;

CREATE FUNCTION agentsaga_count_finished_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
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
UPDATE saga_finished_counts
SET completed   = (SELECT count(*) FROM saga_instances WHERE state = 'completed'),
    compensated = (SELECT count(*) FROM saga_instances WHERE state = 'compensated'),
    aborted     = (SELECT count(*) FROM saga_instances WHERE state = 'aborted')
WHERE shard = 0;
