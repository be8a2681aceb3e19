-- `agentsaga_ack_and_claim` told how many rows it marked delivered in the `attempts`
-- column of a row whose other columns were NULL. The count now has a column of its
-- own, `acked`: the first row carries it (and NULLs elsewhere), the claimed rows
-- follow with `acked` NULL. PostgreSQL only, like 0004.

DROP FUNCTION agentsaga_ack_and_claim(TEXT, BIGINT[], BIGINT, TEXT[], BIGINT);

CREATE FUNCTION agentsaga_ack_and_claim(owner TEXT, delivered BIGINT[], lease_ms BIGINT,
                                        destinations TEXT[], lim BIGINT)
RETURNS TABLE (acked BIGINT, seq BIGINT, id UUID, destination TEXT, key TEXT,
               payload TEXT, headers TEXT, attempts INTEGER, created_at BIGINT)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    n BIGINT;
BEGIN
    UPDATE outbox o
    SET state = 'delivered', delivered_at = now(), lease_owner = NULL, lease_until = NULL
    WHERE o.seq = ANY($2) AND o.lease_owner = $1;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN QUERY SELECT n, NULL::BIGINT, NULL::UUID, NULL::TEXT, NULL::TEXT, NULL::TEXT,
        NULL::TEXT, NULL::INTEGER, NULL::BIGINT;
    RETURN QUERY SELECT NULL::BIGINT, c.* FROM agentsaga_claim($1, $3, $4, $5) c;
END
$$;
