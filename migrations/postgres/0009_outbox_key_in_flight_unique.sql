-- Per-key order under concurrent producers (guarantee 3): at most one row of a key is
-- in flight, enforced by the database. A producer that writes a row leased for direct
-- handover decides "no live row of this key" with NOT EXISTS, which under READ
-- COMMITTED cannot see a concurrent transaction's uncommitted row: two producers of one
-- key could both write theirs in flight. With this index the second one's insert waits
-- for the first transaction and, if it committed, does nothing (ON CONFLICT DO
-- NOTHING); the producer then writes its row pending, behind the first.
--
-- Rows that an older version left in flight twice for one key (the very race above)
-- would fail the index: all but the first of each key go back to pending, leaseless, as
-- a lost lease does (the inbox makes their redelivery harmless).
UPDATE outbox o
SET state = 'pending', lease_owner = NULL, lease_until = NULL
WHERE o.state = 'in_flight' AND o.key IS NOT NULL
  AND EXISTS (SELECT 1 FROM outbox f
              WHERE f.key = o.key AND f.state = 'in_flight' AND f.seq < o.seq);
DROP INDEX outbox_key_in_flight;
CREATE UNIQUE INDEX outbox_key_in_flight ON outbox (key)
    WHERE key IS NOT NULL AND state = 'in_flight';
