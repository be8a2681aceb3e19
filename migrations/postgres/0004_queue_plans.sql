-- Plans fit for a queue table.
--
-- An outbox churns: every row is inserted pending, updated in flight, then delivered,
-- and until VACUUM comes by, each partial index keeps an entry for every dead version.
-- Autovacuum and autoanalyze lag behind such a table, so the planner believes the
-- partial indexes hold a handful of rows and answers the claim and the acknowledgements
-- with a bitmap scan over the whole partial index: every dead entry is visited on every
-- call, and bitmap scans never mark entries dead, so the cost grows until VACUUM. On the
-- saga bench (2,000 sagas in 8 s) that was about 1 ms and 500 heap pages per claim and
-- per acknowledgement.

-- 1. A row has a lease owner exactly when it is in flight. With that enforced, the
--    acknowledgements (delivered, retry, dead, release, renew) find their rows by
--    primary key and lease owner, and no partial index can tempt the planner.
ALTER TABLE outbox ADD CONSTRAINT outbox_leased_iff_in_flight
    CHECK ((state = 'in_flight') = (lease_owner IS NOT NULL));

-- 2. The claim. Its statement is the relay's (one per claim, no transaction around it);
--    the function exists to plan it with bitmap scans, sequential scans and sorts
--    disabled, which leaves one plan: walk outbox_pending in seq order and stop after
--    `lim` ready rows. A plain index scan also marks the dead entries it meets, so the
--    next claim skips them without visiting the heap.
--
--    SKIP LOCKED: concurrent claimers (other processes) pass over each other's rows
--    instead of queueing behind them. A row they lock and mark in flight is rechecked
--    against the WHERE clause, so it is never claimed twice. The per-key check is two
--    probes: an earlier row of the key pending or in flight (outbox_key), or a row of
--    the key in flight (outbox_key_in_flight).
CREATE FUNCTION agentsaga_claim(owner TEXT, lease_ms BIGINT, destinations TEXT[], lim BIGINT)
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
        lease_until = now() + $2 * interval '1 millisecond', attempts = o.attempts + 1
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

-- 3. Acknowledge and claim in one round trip: the relay writes the rows it delivered
--    and claims the next ones in one call, so the claim sees the acknowledged rows as
--    delivered (their keys' next rows become claimable). The first row returned carries
--    the number of rows marked delivered in `attempts`, every other column NULL; the
--    claimed rows follow.
CREATE FUNCTION agentsaga_ack_and_claim(owner TEXT, delivered BIGINT[], lease_ms BIGINT,
                                        destinations TEXT[], lim BIGINT)
RETURNS TABLE (seq BIGINT, id UUID, destination TEXT, key TEXT, payload TEXT,
               headers TEXT, attempts INTEGER, created_at BIGINT)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    acked BIGINT;
BEGIN
    UPDATE outbox o
    SET state = 'delivered', delivered_at = now(), lease_owner = NULL, lease_until = NULL
    WHERE o.seq = ANY($2) AND o.lease_owner = $1;
    GET DIAGNOSTICS acked = ROW_COUNT;
    RETURN QUERY SELECT NULL::BIGINT, NULL::UUID, NULL::TEXT, NULL::TEXT, NULL::TEXT,
        NULL::TEXT, acked::INTEGER, NULL::BIGINT;
    RETURN QUERY SELECT * FROM agentsaga_claim($1, $3, $4, $5);
END
$$;
