-- A waiting start that cannot be started when its turn comes (its data no longer
-- decodes as the saga's input after a deploy, its first command is over the message
-- size limit...) is set aside with the reason (`error`, and when: `set_aside_at`)
-- instead of failing every admission of its saga name: the starts behind it go on.
-- Operators see it (`agentsaga status`, `agentsaga starts list`) and delete it
-- (`agentsaga starts remove`). Admission takes only rows whose `error` is NULL.
ALTER TABLE saga_starts ADD COLUMN error TEXT;
ALTER TABLE saga_starts ADD COLUMN set_aside_at INTEGER;
