-- An operator's pause of a saga (JSON): who paused it, why and when, and what it held
-- back meanwhile (the next stage, a step sent again, a compensation), sent when it is
-- resumed. NULL for a saga never paused (or resumed and released).
ALTER TABLE saga_instances ADD COLUMN pause TEXT;
