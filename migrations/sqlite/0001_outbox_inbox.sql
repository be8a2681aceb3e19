-- The transactional outbox and the inbox (DESIGN §3).
-- Times are Unix milliseconds (INTEGER): SQLite has no timestamp type, and integer
-- comparisons keep the claim query on its index.
CREATE TABLE outbox (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT    NOT NULL UNIQUE,
    destination  TEXT    NOT NULL,
    key          TEXT,
    payload      TEXT    NOT NULL,
    headers      TEXT    NOT NULL DEFAULT '{}',
    state        TEXT    NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'in_flight', 'delivered', 'dead')),
    attempts     INTEGER NOT NULL DEFAULT 0,
    available_at INTEGER NOT NULL,
    lease_owner  TEXT,
    lease_until  INTEGER,
    last_error   TEXT,
    created_at   INTEGER NOT NULL,
    delivered_at INTEGER
);

-- "Ready rows in order": the claim walks pending rows by seq.
CREATE INDEX outbox_pending ON outbox (seq) WHERE state = 'pending';
-- "By key": is an earlier row of this key pending, or any row of it in flight?
CREATE INDEX outbox_key ON outbox (key, seq)
    WHERE key IS NOT NULL AND state IN ('pending', 'in_flight');
-- Expired leases.
CREATE INDEX outbox_lease ON outbox (lease_until) WHERE state = 'in_flight';
-- Pruning delivered rows.
CREATE INDEX outbox_delivered ON outbox (delivered_at) WHERE state = 'delivered';
-- Dead letters, by destination.
CREATE INDEX outbox_dead ON outbox (destination, seq) WHERE state = 'dead';

CREATE TABLE inbox (
    consumer    TEXT    NOT NULL,
    message_id  TEXT    NOT NULL,
    received_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;

CREATE INDEX inbox_received_at ON inbox (received_at);
