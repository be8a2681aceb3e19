-- no-transaction
-- The state CHECKs as chains of equalities instead of IN lists. SQLite evaluates
-- `CHECK (state IN ('pending', 'in_flight', 'delivered', 'dead'))` by building an
-- ephemeral index of the list (opening a temporary b-tree, inserting each value,
-- closing it) for every row it inserts or updates: five to six times per hop of a saga
-- (without it the saga bench made ~24 % more sagas/s). `state = 'pending' OR state = 'in_flight' OR …`
-- accepts and rejects exactly the same values (NULL included: both give NULL, which a
-- CHECK lets pass) with a few comparisons.
--
-- SQLite cannot alter a CHECK, so the three tables are rebuilt with the generalized
-- ALTER TABLE procedure (https://sqlite.org/lang_altertable.html#otheralter): a new
-- table, the rows copied, the old one dropped, the new one renamed, its indexes made
-- again under their names. Names, columns, keys, indexes and rows stay as they were;
-- the outbox's AUTOINCREMENT high-water mark too (a pruned row's seq is never reused).
-- All in one transaction (a crash before its COMMIT leaves the old tables, and the
-- migration runs again on the next open). Foreign keys are off meanwhile, or dropping
-- saga_instances would delete every step and signal by cascade; they are back on at the
-- end, as the store opens its connections.
PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

CREATE TABLE outbox_new (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT    NOT NULL UNIQUE,
    destination  TEXT    NOT NULL,
    key          TEXT,
    payload      TEXT    NOT NULL,
    headers      TEXT    NOT NULL DEFAULT '{}',
    state        TEXT    NOT NULL DEFAULT 'pending'
                 CHECK (state = 'pending' OR state = 'in_flight' OR state = 'delivered'
                        OR state = 'dead'),
    attempts     INTEGER NOT NULL DEFAULT 0,
    available_at INTEGER NOT NULL,
    lease_owner  TEXT,
    lease_until  INTEGER,
    last_error   TEXT,
    created_at   INTEGER NOT NULL,
    delivered_at INTEGER
);
INSERT INTO outbox_new (seq, id, destination, key, payload, headers, state, attempts,
                        available_at, lease_owner, lease_until, last_error, created_at,
                        delivered_at)
    SELECT seq, id, destination, key, payload, headers, state, attempts, available_at,
           lease_owner, lease_until, last_error, created_at, delivered_at
    FROM outbox;
DELETE FROM sqlite_sequence WHERE name = 'outbox_new';
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'outbox_new', seq FROM sqlite_sequence WHERE name = 'outbox';
DROP TABLE outbox;
ALTER TABLE outbox_new RENAME TO outbox;
CREATE INDEX outbox_pending ON outbox (seq) WHERE state = 'pending';
CREATE INDEX outbox_key ON outbox (key, seq)
    WHERE key IS NOT NULL AND state IN ('pending', 'in_flight');
CREATE INDEX outbox_lease ON outbox (lease_until) WHERE state = 'in_flight';
CREATE INDEX outbox_delivered ON outbox (delivered_at) WHERE state = 'delivered';
CREATE INDEX outbox_dead ON outbox (destination, seq) WHERE state = 'dead';
CREATE INDEX outbox_key_in_flight ON outbox (key) WHERE key IS NOT NULL AND state = 'in_flight';

CREATE TABLE saga_instances_new (
    id          TEXT    PRIMARY KEY,
    name        TEXT    NOT NULL,
    version     INTEGER NOT NULL,
    state       TEXT    NOT NULL
                CHECK (state = 'running' OR state = 'compensating' OR state = 'completed'
                       OR state = 'compensated' OR state = 'stuck' OR state = 'aborted'),
    data        TEXT    NOT NULL,
    error       TEXT,
    stage       INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    finished_at INTEGER
);
INSERT INTO saga_instances_new (id, name, version, state, data, error, stage, created_at,
                                updated_at, finished_at)
    SELECT id, name, version, state, data, error, stage, created_at, updated_at,
           finished_at
    FROM saga_instances;
DROP TABLE saga_instances;
ALTER TABLE saga_instances_new RENAME TO saga_instances;
CREATE INDEX saga_instances_state ON saga_instances (state, name, version);

CREATE TABLE saga_steps_new (
    saga_id                 TEXT    NOT NULL REFERENCES saga_instances (id) ON DELETE CASCADE,
    idx                     INTEGER NOT NULL,
    stage                   INTEGER NOT NULL,
    name                    TEXT    NOT NULL,
    destination             TEXT    NOT NULL,
    state                   TEXT    NOT NULL
                            CHECK (state = 'dispatched' OR state = 'succeeded'
                                   OR state = 'failed'),
    attempts                INTEGER NOT NULL DEFAULT 0,
    command_id              TEXT,
    timer_id                TEXT,
    input                   TEXT,
    output                  TEXT,
    error                   TEXT,
    compensation_destination TEXT,
    compensation_payload    TEXT,
    compensation_state      TEXT
                            CHECK (compensation_state = 'recorded'
                                   OR compensation_state = 'not_needed'
                                   OR compensation_state = 'dispatched'
                                   OR compensation_state = 'done'
                                   OR compensation_state = 'skipped'
                                   OR compensation_state = 'failed'),
    compensation_attempts   INTEGER NOT NULL DEFAULT 0,
    compensation_message_id TEXT,
    compensation_error      TEXT,
    deadline                INTEGER,
    dispatched_at           INTEGER,
    replied_at              INTEGER,
    compensated_at          INTEGER,
    PRIMARY KEY (saga_id, idx)
) WITHOUT ROWID;
INSERT INTO saga_steps_new (saga_id, idx, stage, name, destination, state, attempts,
                            command_id, timer_id, input, output, error,
                            compensation_destination, compensation_payload,
                            compensation_state, compensation_attempts,
                            compensation_message_id, compensation_error, deadline,
                            dispatched_at, replied_at, compensated_at)
    SELECT saga_id, idx, stage, name, destination, state, attempts, command_id, timer_id,
           input, output, error, compensation_destination, compensation_payload,
           compensation_state, compensation_attempts, compensation_message_id,
           compensation_error, deadline, dispatched_at, replied_at, compensated_at
    FROM saga_steps;
DROP TABLE saga_steps;
ALTER TABLE saga_steps_new RENAME TO saga_steps;

COMMIT;

PRAGMA foreign_keys = ON;
