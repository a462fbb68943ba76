CREATE INDEX IF NOT EXISTS {{.AggregateIdx}} ON {{.Outbox}} (aggregate_id, id) WHERE dispatched_at IS NULL;
