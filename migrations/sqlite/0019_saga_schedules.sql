-- Schedules (issue 48): a saga started on a calendar. One row per schedule, shared by
-- every process of the database; a firing locks its row, starts its saga under the
-- start key `schedule:<name>:<slot ms>` (saga_keys: each slot starts at most one saga,
-- whichever process fires it) and moves the row to its next slot, in one transaction.
-- Times are Unix milliseconds. `next_slot_ms` is the next time the cron expression
-- names (NULL: none left); `next_due_ms` is that slot plus its jitter, when it fires.
-- `queued_slot_ms` is a slot waiting for the previous firing's saga to end (overlap
-- `queue_one`).
CREATE TABLE saga_schedules (
    name           TEXT    PRIMARY KEY,
    saga_name      TEXT    NOT NULL,
    input          TEXT    NOT NULL,
    cron           TEXT    NOT NULL,
    time_zone      TEXT    NOT NULL,
    overlap        TEXT    NOT NULL,
    catch_up       TEXT    NOT NULL,
    catch_up_max   INTEGER NOT NULL,
    late_after_ms  INTEGER NOT NULL,
    jitter_ms      INTEGER NOT NULL,
    paused         BOOLEAN NOT NULL,
    next_slot_ms   INTEGER,
    next_due_ms    INTEGER,
    queued_slot_ms INTEGER,
    last_slot_ms   INTEGER,
    last_saga_id   TEXT,
    last_fired_ms  INTEGER,
    last_error     TEXT,
    fired          INTEGER NOT NULL DEFAULT 0,
    skipped        INTEGER NOT NULL DEFAULT 0,
    created_ms     INTEGER NOT NULL,
    updated_ms     INTEGER NOT NULL
);
CREATE INDEX saga_schedules_due ON saga_schedules (next_due_ms);
