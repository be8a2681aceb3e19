-- Admission control: starts accepted while their saga name had as many sagas in flight
-- as its bound. They are started in order (seq) as sagas finish; the saga id is given
-- out when the start is accepted and kept when it is started.
CREATE TABLE saga_starts (
    seq        BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id         UUID        NOT NULL UNIQUE,
    name       TEXT        NOT NULL,
    data       JSONB       NOT NULL,
    headers    JSONB       NOT NULL DEFAULT '{}',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX saga_starts_name ON saga_starts (name, seq);
