-- One saga, one trace (DESIGN §1): the W3C trace context of a saga's `saga.start`
-- span, kept with the saga, so that a signal or an operator's act, sent from any
-- process long after the start, continues the saga's trace instead of beginning one
-- of its own. NULL for a saga started without a tracer (or before this column).
ALTER TABLE saga_instances ADD COLUMN trace_parent TEXT;
