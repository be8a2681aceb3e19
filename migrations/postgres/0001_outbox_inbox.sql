-- The transactional outbox and the inbox (DESIGN §3).
CREATE TABLE outbox (
    seq          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           UUID        NOT NULL UNIQUE,
    destination  TEXT        NOT NULL,
    key          TEXT,
    payload      JSONB       NOT NULL,
    headers      JSONB       NOT NULL DEFAULT '{}',
    state        TEXT        NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'in_flight', 'delivered', 'dead')),
    attempts     INTEGER     NOT NULL DEFAULT 0,
    available_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_owner  TEXT,
    lease_until  TIMESTAMPTZ,
    last_error   TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    delivered_at TIMESTAMPTZ
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
    consumer    TEXT        NOT NULL,
    message_id  UUID        NOT NULL,
    received_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX inbox_received_at ON inbox (received_at);
