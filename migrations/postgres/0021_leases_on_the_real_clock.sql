-- Leases count from the server's real clock named in full, `pg_catalog.clock_timestamp()`:
-- the same function as before (0011), so nothing changes in production, but a test's
-- manual clock (the testing feature's `agentsaga_clock` schema, which shadows the
-- unqualified `now()` and `clock_timestamp()` through the search path) leaves leases on
-- real time: a lease tells a live holder from a dead one by real time, whatever the
-- saga's clock. The claim below is 0011's with only that changed; `available_at <=
-- now()` stays unqualified (a due time: the saga's clock).
CREATE OR REPLACE FUNCTION agentsaga_claim(owner TEXT, lease_ms BIGINT, destinations TEXT[], lim BIGINT)
RETURNS TABLE (seq BIGINT, id UUID, destination TEXT, key TEXT, payload TEXT,
               headers TEXT, attempts INTEGER, created_at BIGINT)
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_sort = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE outbox o
    SET state = 'in_flight', lease_owner = $1,
        lease_until = pg_catalog.clock_timestamp() + $2 * interval '1 millisecond', attempts = o.attempts + 1
    WHERE o.seq IN (
        SELECT c.seq FROM outbox c
        WHERE c.state = 'pending' AND c.available_at <= now()
          AND c.destination = ANY($3)
          AND (c.key IS NULL OR (
                  NOT EXISTS (SELECT 1 FROM outbox p
                      WHERE p.key = c.key AND p.seq < c.seq
                        AND p.key IS NOT NULL AND p.state IN ('pending', 'in_flight'))
                  AND NOT EXISTS (SELECT 1 FROM outbox f
                      WHERE f.key = c.key AND f.key IS NOT NULL AND f.state = 'in_flight')))
        ORDER BY c.seq
        LIMIT $4
        FOR UPDATE SKIP LOCKED)
    RETURNING o.seq, o.id, o.destination, o.key, o.payload::text,
        o.headers::text, o.attempts,
        (extract(epoch FROM o.created_at) * 1000)::bigint;
END
$$;
