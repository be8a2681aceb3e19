-- Admission control: starts accepted while their saga name had as many sagas in flight
-- as its bound. They are started in order (seq) as sagas finish; the saga id is given
-- out when the start is accepted and kept when it is started.
CREATE TABLE saga_starts (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    id         TEXT    NOT NULL UNIQUE,
    name       TEXT    NOT NULL,
    data       TEXT    NOT NULL,
    headers    TEXT    NOT NULL DEFAULT '{}',
    created_at INTEGER NOT NULL
);
CREATE INDEX saga_starts_name ON saga_starts (name, seq);
