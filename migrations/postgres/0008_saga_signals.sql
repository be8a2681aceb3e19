-- Signals a saga waits for (`Step::wait_for`): one row per declared wait, written when
-- the saga starts; a signal fills in its outcome (approve: the payload, or reject: the
-- reason). A signal that arrives before the saga reaches its wait is kept here until it
-- does; a second signal for the same wait finds the outcome set and changes nothing.
CREATE TABLE saga_signals (
    saga_id     UUID        NOT NULL REFERENCES saga_instances (id) ON DELETE CASCADE,
    name        TEXT        NOT NULL,
    outcome     JSONB,
    received_at TIMESTAMPTZ,
    PRIMARY KEY (saga_id, name)
);
