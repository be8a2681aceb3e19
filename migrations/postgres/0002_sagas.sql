-- Saga instances and their steps: the persisted state machine and the compensation
-- ledger (DESIGN §3).
CREATE TABLE saga_instances (
    id          UUID        PRIMARY KEY,
    name        TEXT        NOT NULL,
    version     INTEGER     NOT NULL,
    state       TEXT        NOT NULL CHECK (state IN
                ('running', 'compensating', 'completed', 'compensated', 'stuck', 'aborted')),
    data        JSONB       NOT NULL,
    error       TEXT,
    stage       INTEGER     NOT NULL DEFAULT 0,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ
);
CREATE INDEX saga_instances_state ON saga_instances (state, name, version);

CREATE TABLE saga_steps (
    saga_id                 UUID        NOT NULL REFERENCES saga_instances (id) ON DELETE CASCADE,
    idx                     INTEGER     NOT NULL,
    stage                   INTEGER     NOT NULL,
    name                    TEXT        NOT NULL,
    destination             TEXT        NOT NULL,
    state                   TEXT        NOT NULL CHECK (state IN ('dispatched', 'succeeded', 'failed')),
    attempts                INTEGER     NOT NULL DEFAULT 0,
    command_id              UUID,
    timer_id                UUID,
    input                   JSONB,
    output                  JSONB,
    error                   TEXT,
    compensation_destination TEXT,
    compensation_payload    JSONB,
    compensation_state      TEXT CHECK (compensation_state IN
                            ('recorded', 'not_needed', 'dispatched', 'done', 'skipped', 'failed')),
    compensation_attempts   INTEGER     NOT NULL DEFAULT 0,
    compensation_message_id UUID,
    compensation_error      TEXT,
    deadline                TIMESTAMPTZ,
    dispatched_at           TIMESTAMPTZ,
    replied_at              TIMESTAMPTZ,
    compensated_at          TIMESTAMPTZ,
    PRIMARY KEY (saga_id, idx)
);
