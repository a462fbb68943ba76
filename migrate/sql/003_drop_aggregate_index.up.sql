-- The claim's order check no longer looks each aggregate up in this index:
-- it reads the pending rows up to its last candidate from the pending index
-- (relay/sql.go), one walk instead of one descent per aggregate. Nothing
-- else needs it, and every Emit paid for it: a third index insert, at a
-- random position (aggregate ids are UUIDs).
DROP INDEX IF EXISTS {{aggregate_idx}};
