-- The claim's per-key check asks two questions; each gets an index that answers it
-- with one probe: "is an earlier row of this key pending?" walks outbox_key (key, seq)
-- below the candidate's seq, and "is a row of this key in flight?" probes this one.
CREATE INDEX outbox_key_in_flight ON outbox (key) WHERE key IS NOT NULL AND state = 'in_flight';
