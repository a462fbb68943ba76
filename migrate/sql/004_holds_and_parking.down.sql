-- Parked rows are dropped with their table: unpark them first to keep them.
DROP TABLE IF EXISTS {{.Parked}};
ALTER TABLE {{.Failures}} DROP COLUMN IF EXISTS held_until, DROP COLUMN IF EXISTS reason;
ALTER TABLE {{.Outbox}} DROP COLUMN IF EXISTS requeued_at;
