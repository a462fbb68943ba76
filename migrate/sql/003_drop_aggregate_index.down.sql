CREATE INDEX IF NOT EXISTS {{aggregate_idx}} ON {{outbox}} (aggregate_id, id) WHERE dispatched_at IS NULL;
