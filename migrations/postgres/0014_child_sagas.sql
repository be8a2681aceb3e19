-- Child sagas (issue 34): a step of a saga may be a saga of its own. The child
-- records its parent: `parent_id` (the parent saga, indexed for `sagas list --parent`)
-- and `parent`, the link its answers are addressed with (JSON: the parent's step, its
-- orchestrator destination, the command that started the child and the compensation
-- that undoes it, the child's depth). Both are NULL for a saga started on its own.
ALTER TABLE saga_instances ADD COLUMN parent_id UUID;
ALTER TABLE saga_instances ADD COLUMN parent JSONB;
CREATE INDEX saga_instances_parent ON saga_instances (parent_id) WHERE parent_id IS NOT NULL;
