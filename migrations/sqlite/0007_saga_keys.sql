-- Idempotent starts: a start with a caller's key (an order id, a request id) claims
-- (name, key) here in the same transaction that starts (or queues) the saga; a second
-- start with the same name and key finds the row and returns its saga id instead.
CREATE TABLE saga_keys (
    name       TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    saga_id    TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (name, key)
);
CREATE INDEX saga_keys_saga ON saga_keys (saga_id);
