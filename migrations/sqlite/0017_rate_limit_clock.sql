-- Rate limits hold (issue 45): when the row was written (Unix ms, by the clock of the
-- time: a clock stepped back since moves the pace back by as much), the running
-- average of the tokens the destination's calls used (NULL: none reported yet; what a
-- call without an estimate reserves), and until when a first call without an
-- estimate is finding that out (the others of its kind wait for it).
ALTER TABLE rate_limits ADD COLUMN written_at REAL NOT NULL DEFAULT 0;
ALTER TABLE rate_limits ADD COLUMN tokens_avg REAL;
ALTER TABLE rate_limits ADD COLUMN probe_until REAL NOT NULL DEFAULT 0;
