-- Parked rows are dropped with their table: unpark them first to keep them.
DROP TABLE IF EXISTS {{parked}};
ALTER TABLE {{failures}} DROP COLUMN IF EXISTS held_until, DROP COLUMN IF EXISTS reason;
ALTER TABLE {{outbox}} DROP COLUMN IF EXISTS requeued_at;
