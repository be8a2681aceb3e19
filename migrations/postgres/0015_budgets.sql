-- Budgets (issue 35): what a saga and each of its steps used, as agents reported it
-- with their replies (JSON: tokens_in, tokens_out, cost_micros, calls; NULL: nothing
-- reported), and the saga's budget (JSON: the limits, what to do once they are spent,
-- the forward dispatches held back meanwhile; NULL: no budget).
ALTER TABLE saga_instances ADD COLUMN usage JSONB;
ALTER TABLE saga_instances ADD COLUMN budget JSONB;
ALTER TABLE saga_steps ADD COLUMN usage JSONB;
