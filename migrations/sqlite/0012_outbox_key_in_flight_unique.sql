-- Per-key order, enforced by the database as on PostgreSQL (its 0009): at most one row
-- of a key is in flight. SQLite's single writer already serialises producers, so this
-- only guards against a bug, and keeps the two trees' schemas the same.
--
-- Rows an older version left in flight twice for one key go back to pending, leaseless,
-- all but the first of each key, as a lost lease does (the inbox makes their
-- redelivery harmless).
UPDATE outbox
SET state = 'pending', lease_owner = NULL, lease_until = NULL
WHERE state = 'in_flight' AND key IS NOT NULL
  AND EXISTS (SELECT 1 FROM outbox f
              WHERE f.key = outbox.key AND f.state = 'in_flight' AND f.seq < outbox.seq);
DROP INDEX outbox_key_in_flight;
CREATE UNIQUE INDEX outbox_key_in_flight ON outbox (key)
    WHERE key IS NOT NULL AND state = 'in_flight';
