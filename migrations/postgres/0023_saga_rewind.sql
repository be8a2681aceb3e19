-- An operator's rewind of a saga to a step (issue 50): the saga's data as each stage
-- began, kept on the stage's first step (what a rewind to that stage restores), and
-- the saga's rewinds (JSON): the one under way (to which step, by whom, why) and those
-- done, each with the steps it undid.
ALTER TABLE saga_steps ADD COLUMN data_before JSONB;
ALTER TABLE saga_instances ADD COLUMN rewinds JSONB;
