-- Saga instances and their steps: the persisted state machine and the compensation
-- ledger (DESIGN §3). Times are Unix milliseconds.
CREATE TABLE saga_instances (
    id          TEXT    PRIMARY KEY,
    name        TEXT    NOT NULL,
    version     INTEGER NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN
                ('running', 'compensating', 'completed', 'compensated', 'stuck', 'aborted')),
    data        TEXT    NOT NULL,
    error       TEXT,
    stage       INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    finished_at INTEGER
);
CREATE INDEX saga_instances_state ON saga_instances (state, name, version);

CREATE TABLE saga_steps (
    saga_id                 TEXT    NOT NULL REFERENCES saga_instances (id) ON DELETE CASCADE,
    idx                     INTEGER NOT NULL,
    stage                   INTEGER NOT NULL,
    name                    TEXT    NOT NULL,
    destination             TEXT    NOT NULL,
    state                   TEXT    NOT NULL CHECK (state IN ('dispatched', 'succeeded', 'failed')),
    attempts                INTEGER NOT NULL DEFAULT 0,
    command_id              TEXT,
    timer_id                TEXT,
    input                   TEXT,
    output                  TEXT,
    error                   TEXT,
    compensation_destination TEXT,
    compensation_payload    TEXT,
    compensation_state      TEXT CHECK (compensation_state IN
                            ('recorded', 'not_needed', 'dispatched', 'done', 'skipped', 'failed')),
    compensation_attempts   INTEGER NOT NULL DEFAULT 0,
    compensation_message_id TEXT,
    compensation_error      TEXT,
    deadline                INTEGER,
    dispatched_at           INTEGER,
    replied_at              INTEGER,
    compensated_at          INTEGER,
    PRIMARY KEY (saga_id, idx)
) WITHOUT ROWID;
