-- A wait that is a person's decision (`Step::approval`, a plan step's `"approval":
-- true`, `PlannedBuilder::approvals`): its signal is taken only from a person's path
-- (the CLI, the console's API and page, the application's own code), never from an
-- LLM-facing one (the MCP tools). Written once, with the wait's row, when the saga (or
-- its plan) declares the wait; every wait declared before this column existed is no
-- approval.
ALTER TABLE saga_signals ADD COLUMN approval BOOLEAN NOT NULL DEFAULT FALSE;
