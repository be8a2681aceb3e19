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
    input          JSONB   NOT NULL,
    cron           TEXT    NOT NULL,
    time_zone      TEXT    NOT NULL,
    overlap        TEXT    NOT NULL,
    catch_up       TEXT    NOT NULL,
    catch_up_max   BIGINT  NOT NULL,
    late_after_ms  BIGINT  NOT NULL,
    jitter_ms      BIGINT  NOT NULL,
    paused         BOOLEAN NOT NULL,
    next_slot_ms   BIGINT,
    next_due_ms    BIGINT,
    queued_slot_ms BIGINT,
    last_slot_ms   BIGINT,
    last_saga_id   UUID,
    last_fired_ms  BIGINT,
    last_error     TEXT,
    fired          BIGINT  NOT NULL DEFAULT 0,
    skipped        BIGINT  NOT NULL DEFAULT 0,
    created_ms     BIGINT  NOT NULL,
    updated_ms     BIGINT  NOT NULL
);
CREATE INDEX saga_schedules_due ON saga_schedules (next_due_ms);
