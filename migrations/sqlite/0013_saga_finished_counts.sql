-- How many sagas are finished, per final state, kept by the database itself so that
-- the overview (`agentsaga status`, the console, MCP) reads three numbers instead of
-- counting every saga ever kept (issue 31: under 50 ms at a million finished sagas).
--
-- Triggers keep the counts whatever writes saga_instances (the runtime, `prune`, an
-- operator's own DELETE): a saga entering a final state adds one, leaving it (it does
-- not, today) or being deleted takes one away. The counts change in the transaction
-- that changes the saga, so they are exact at every commit. SQLite has one writer:
-- the triggers update the counter row (shard 0) directly. PostgreSQL appends deltas
-- instead, folded later (its 0013).
--
-- A later migration that rebuilds saga_instances (SQLite's ALTER TABLE by copy, as
-- 0009 did) drops these triggers with the old table: it must create them again.
CREATE TABLE saga_finished_counts (
    shard       INTEGER PRIMARY KEY,
    completed   INTEGER NOT NULL DEFAULT 0,
    compensated INTEGER NOT NULL DEFAULT 0,
    aborted     INTEGER NOT NULL DEFAULT 0
);

INSERT INTO saga_finished_counts (shard, completed, compensated, aborted)
SELECT 0,
       coalesce(sum(state = 'completed'), 0),
       coalesce(sum(state = 'compensated'), 0),
       coalesce(sum(state = 'aborted'), 0)
FROM saga_instances;

CREATE TRIGGER saga_finished_insert AFTER INSERT ON saga_instances
WHEN NEW.state = 'completed' OR NEW.state = 'compensated' OR NEW.state = 'aborted'
BEGIN
    UPDATE saga_finished_counts
    SET completed   = completed + (NEW.state = 'completed'),
        compensated = compensated + (NEW.state = 'compensated'),
        aborted     = aborted + (NEW.state = 'aborted')
    WHERE shard = 0;
END;

CREATE TRIGGER saga_finished_update AFTER UPDATE OF state ON saga_instances
WHEN OLD.state IS NOT NEW.state
 AND (OLD.state = 'completed' OR OLD.state = 'compensated' OR OLD.state = 'aborted'
      OR NEW.state = 'completed' OR NEW.state = 'compensated' OR NEW.state = 'aborted')
BEGIN
    UPDATE saga_finished_counts
    SET completed   = completed + (NEW.state = 'completed') - (OLD.state = 'completed'),
        compensated = compensated + (NEW.state = 'compensated') - (OLD.state = 'compensated'),
        aborted     = aborted + (NEW.state = 'aborted') - (OLD.state = 'aborted')
    WHERE shard = 0;
END;

CREATE TRIGGER saga_finished_delete AFTER DELETE ON saga_instances
WHEN OLD.state = 'completed' OR OLD.state = 'compensated' OR OLD.state = 'aborted'
BEGIN
    UPDATE saga_finished_counts
    SET completed   = completed - (OLD.state = 'completed'),
        compensated = compensated - (OLD.state = 'compensated'),
        aborted     = aborted - (OLD.state = 'aborted')
    WHERE shard = 0;
END;
