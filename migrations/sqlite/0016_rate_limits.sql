-- Provider rate limits (issue 35), shared by every process of the database: one row per
-- rate-limited destination, written by the calls that reserve their slots (the limits
-- themselves are configuration: `RuntimeBuilder::rate_limit`). Times are Unix
-- milliseconds: when the next call and the next token are due at the limit's pace
-- (the generic cell rate algorithm's "theoretical arrival times"), and until when a
-- provider's 429 paused the destination.
CREATE TABLE rate_limits (
    destination TEXT PRIMARY KEY,
    requests_at REAL NOT NULL DEFAULT 0,
    tokens_at REAL NOT NULL DEFAULT 0,
    paused_until REAL NOT NULL DEFAULT 0
);
