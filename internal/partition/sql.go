package partition

import "github.com/pgoutbox/outbox/internal/sqltext"

// The statements that read and change one outbox table's partitions. They
// read the catalog, or name the partition, which is known only at run time:
// those are templates (sqltext.RegisterTemplates), their %s filled with
// quoted identifiers (pgident), their %d with the bounds.

// listSQL lists the partitions of the partitioned table $1 (its quoted
// name) with their bounds as Postgres prints them, whether a concurrent
// detach of it is unfinished, and its estimated rows. pg_inherits is read
// by its index on inhparent.
const listSQL = `SELECT c.relname::text, pg_catalog.pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending, c.reltuples::bigint
FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`

// partitionedSQL reads whether the table $1 (quoted) is partitioned.
const partitionedSQL = `SELECT coalesce((SELECT relkind = 'p' FROM pg_catalog.pg_class WHERE oid = to_regclass($1)), false)`

// stateSQL reads whether the table $1 exists, whether it is a partition of
// $2 and whether its detach is unfinished (both quoted names).
const stateSQL = `SELECT c.oid IS NOT NULL, i.inhrelid IS NOT NULL, coalesce(i.inhdetachpending, false)
FROM (SELECT to_regclass($1) AS oid) c
LEFT JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = $2::regclass`

// ownerSQL reads the owner of the table $1 (quoted), and whether the
// session's role is that owner.
const ownerSQL = `SELECT pg_catalog.pg_get_userbyid(c.relowner)::text, c.relowner = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user)
FROM pg_catalog.pg_class c WHERE c.oid = $1::regclass`

// migrationLockSQL takes the migration lock (lockkey.Migration) for the
// transaction that adds a partition: migrations and Adds serialise.
const migrationLockSQL = `SELECT pg_advisory_xact_lock($1)`

// lockTimeoutSQL bounds, for the transaction, how long a statement waits
// for a lock; $1 a duration such as '2s'.
const lockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)`

// createSQL makes a partition-to-be, a table shaped like the outbox table
// (the partition, then the outbox table): its columns, defaults (the id
// sequence's nextval), NOT NULLs and CHECK constraints. No index: ATTACH
// creates the outbox's indexes on it (the primary key, the pending index),
// and clones its triggers (the insert guard).
const createSQL = `CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION)`

// boundsSQL is the CHECK that proves the partition's rows are within its
// bounds (the partition, from, to), so that attaching it needs no scan.
const boundsSQL = `ALTER TABLE %s ADD CONSTRAINT partition_bounds CHECK (id >= %d AND id < %d)`

// ownerToSQL hands the partition to the outbox table's owner (the
// partition, the role).
const ownerToSQL = `ALTER TABLE %s OWNER TO %s`

// attachSQL attaches a table as the partition [from, to) of the outbox
// table (the outbox table, the partition, from, to): SHARE UPDATE
// EXCLUSIVE on the outbox table, ACCESS EXCLUSIVE on the partition.
const attachSQL = `ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (%d) TO (%d)`

// detachSQL and finalizeSQL detach a partition concurrently, or finish
// such a detach (the outbox table, the partition). Neither may run inside
// a transaction block.
const (
	detachSQL   = `ALTER TABLE %s DETACH PARTITION %s CONCURRENTLY`
	finalizeSQL = `ALTER TABLE %s DETACH PARTITION %s FINALIZE`
)

var _ = sqltext.Register("partition", map[string]string{
	"listSQL": listSQL, "stateSQL": stateSQL, "partitionedSQL": partitionedSQL, "ownerSQL": ownerSQL,
	"migrationLockSQL": migrationLockSQL, "lockTimeoutSQL": lockTimeoutSQL,
})

var _ = sqltext.RegisterTemplates("partition", map[string]string{
	"createSQL": createSQL, "boundsSQL": boundsSQL, "ownerToSQL": ownerToSQL, "attachSQL": attachSQL,
	"detachSQL": detachSQL, "finalizeSQL": finalizeSQL,
})
