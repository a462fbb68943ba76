package migrate

import (
	"strconv"

	"github.com/pgoutbox/outbox/internal/sqltext"
)

// The migrations themselves are the embedded sql/NNN_name.{up,down}.sql
// files, rendered by New with sqltext's placeholders. The statements here
// keep their bookkeeping: the table of applied versions, read by its
// primary key (version), and the lock concurrent runs serialise on.

// lockSQL takes the migration lock (internal/lockkey.Migration) for the
// migration's transaction; $1 is the key.
const lockSQL = `SELECT pg_advisory_xact_lock($1)`

// createSchemaSQL creates the outbox's schema, before the bookkeeping
// table that lives in it.
const createSchemaSQL = `CREATE SCHEMA IF NOT EXISTS {{schema}}`

// createVersionTableSQL creates the bookkeeping table: one row per applied
// version. Up and Validate read it, so a schema migrated by another tool
// must have it too (UpScript writes it).
const createVersionTableSQL = `CREATE TABLE IF NOT EXISTS {{migrations}} (
  version    INT         PRIMARY KEY,
  applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)`

// currentSQL is the highest applied version, 0 for none. Rows from
// 1000000 up are settings, not migrations.
const currentSQL = `SELECT coalesce(max(version), 0) FROM {{migrations}} WHERE version < 1000000`

// existsSQL tells whether the bookkeeping table exists (a database never
// migrated has none); $1 is its quoted name.
const existsSQL = `SELECT to_regclass($1) IS NOT NULL`

// appliedSQL lists the applied versions in order.
const appliedSQL = `SELECT version, applied_at FROM {{migrations}} WHERE version < 1000000 ORDER BY version`

// Version 1000000 is the row the migrations table holds while binary
// payloads are on: a version no migration reaches. A binary from before
// the setting refuses a schema newer than it knows, so it refuses the
// table (and tells the operator to upgrade) instead of publishing a
// binary row's missing JSON payload as an empty message. currentSQL and
// appliedSQL skip it. binaryMarkSQL and binaryUnmarkSQL write and remove
// it, in the transactions that add and drop the columns.
const (
	binaryMarkSQL   = `INSERT INTO {{migrations}} (version) VALUES (1000000) ON CONFLICT DO NOTHING`
	binaryUnmarkSQL = `DELETE FROM {{migrations}} WHERE version = 1000000`
)

// recordSQL and unrecordSQL record and unrecord one applied version. The
// version is a literal, not a parameter, so that the statements also stand
// in a script (UpScript, DownScript).
func (m *Migrator) recordSQL(version int) string {
	return "INSERT INTO " + m.versionTbl + " (version) VALUES (" + strconv.Itoa(version) + ")"
}

func (m *Migrator) unrecordSQL(version int) string {
	return "DELETE FROM " + m.versionTbl + " WHERE version = " + strconv.Itoa(version)
}

var _ = sqltext.Register("migrate", map[string]string{
	"lockSQL": lockSQL, "createSchemaSQL": createSchemaSQL, "createVersionTableSQL": createVersionTableSQL,
	"currentSQL": currentSQL, "existsSQL": existsSQL, "appliedSQL": appliedSQL,
})

// Binary payloads (binary.go): an optional setting of one outbox table,
// applied after the numbered migrations, each step in a transaction of its
// own so that no step holds a lock longer than a catalog change.

// binaryStateSQL reads whether binary payloads are on: whether the
// table's payload CHECK exists and whether it is validated, and whether
// the constraint that turning them off adds is there. $1 the quoted outbox
// table, $2 its payload CHECK's name, $3 the JSON-only CHECK's name.
const binaryStateSQL = `SELECT
  coalesce((SELECT c.convalidated FROM pg_catalog.pg_constraint c WHERE c.conrelid = to_regclass($1) AND c.conname = $2), false),
  EXISTS (SELECT FROM pg_catalog.pg_constraint c WHERE c.conrelid = to_regclass($1) AND c.conname = $2),
  EXISTS (SELECT FROM pg_catalog.pg_constraint c WHERE c.conrelid = to_regclass($1) AND c.conname = $3)`

// binaryLockTimeoutSQL bounds how long a step waits for its table lock:
// an ALTER TABLE waiting for ACCESS EXCLUSIVE behind a long transaction
// would queue every producer and relayer behind it. A step that times out
// is retried (binaryAttempts).
const binaryLockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)`

// binaryAddSQL adds the columns and the CHECK: catalog changes only.
// ADD COLUMN of a nullable column without a default writes nothing to the
// rows, DROP NOT NULL scans nothing, and the CHECK is added NOT VALID, so
// no row is read under the ACCESS EXCLUSIVE lock this statement holds for
// an instant. Rows inserted from now on are checked; binaryValidateSQL
// proves the rows already there (every one has a payload and no
// payload_bytes) without blocking writes. The content type is 1 to 255
// printable ASCII characters with a '/' after the first: what every
// sink's header or property can carry (RabbitMQ's content_type is a
// short string of at most 255 bytes).
const binaryAddSQL = `ALTER TABLE {{outbox}}
  ADD COLUMN payload_bytes bytea,
  ADD COLUMN content_type  text,
  ALTER COLUMN payload DROP NOT NULL,
  ADD CONSTRAINT {{payload_check}} CHECK (CASE WHEN payload_bytes IS NULL
    THEN payload IS NOT NULL AND content_type IS NULL
    ELSE payload IS NULL AND content_type IS NOT NULL AND octet_length(content_type) <= 255
      AND content_type ~ '^[!-~]+/[ -~]*$' AND content_type !~ ' $' END) NOT VALID`

// binaryAddParkedSQL gives the parked table the same columns, so that a
// binary row is parked and unparked whole. The table holds a handful of
// rows: it is validated at once.
const binaryAddParkedSQL = `ALTER TABLE {{parked}}
  ADD COLUMN payload_bytes bytea,
  ADD COLUMN content_type  text,
  ALTER COLUMN payload DROP NOT NULL,
  ADD CONSTRAINT {{parked_payload_check}} CHECK ((payload IS NULL) <> (payload_bytes IS NULL)
    AND (payload_bytes IS NULL) = (content_type IS NULL))`

// binaryValidateSQL validates the CHECK: a scan of the table under SHARE
// UPDATE EXCLUSIVE, which lets inserts, the claim's updates and cleanup's
// deletes go on.
const binaryValidateSQL = `ALTER TABLE {{outbox}} VALIDATE CONSTRAINT {{payload_check}}`

// binaryRowsSQL counts the rows that hold a binary payload, pending in the
// outbox (the pending index serves it: it reads the backlog, not the
// table) and parked. Turning binary payloads off refuses while any is
// left.
const binaryRowsSQL = `SELECT
  (SELECT count(*) FROM {{outbox}} WHERE payload_bytes IS NOT NULL AND dispatched_at IS NULL),
  (SELECT count(*) FROM {{parked}} WHERE payload_bytes IS NOT NULL)`

// binaryJSONOnlySQL is the first step of turning binary payloads off: a
// CHECK, NOT VALID (an instant's lock), that refuses new binary rows.
const binaryJSONOnlySQL = `ALTER TABLE {{outbox}} ADD CONSTRAINT {{payload_json_only}} CHECK (payload IS NOT NULL) NOT VALID`

// binaryDeleteDispatchedSQL deletes the dispatched rows that hold binary
// payloads, which payload NOT NULL cannot keep: they were published, and
// cleanup would delete them after the retention; only `outbox events
// replay` could have sent them again.
const binaryDeleteDispatchedSQL = `DELETE FROM {{outbox}} WHERE payload_bytes IS NOT NULL AND dispatched_at IS NOT NULL`

// binaryValidateJSONOnlySQL proves no binary row is left, without blocking
// writes, so that SET NOT NULL (binaryDropSQL) needs no scan of its own:
// Postgres takes a valid CHECK (payload IS NOT NULL) as the proof.
const binaryValidateJSONOnlySQL = `ALTER TABLE {{outbox}} VALIDATE CONSTRAINT {{payload_json_only}}`

// binaryDropSQL restores the table as migrated without the setting:
// catalog changes only (DROP COLUMN marks the column dropped and rewrites
// nothing).
const binaryDropSQL = `ALTER TABLE {{outbox}}
  ALTER COLUMN payload SET NOT NULL,
  DROP CONSTRAINT {{payload_json_only}},
  DROP CONSTRAINT {{payload_check}},
  DROP COLUMN payload_bytes,
  DROP COLUMN content_type`

// binaryDropParkedSQL does the same for the parked table (a handful of
// rows: its SET NOT NULL scan is nothing).
const binaryDropParkedSQL = `ALTER TABLE {{parked}}
  DROP CONSTRAINT {{parked_payload_check}},
  ALTER COLUMN payload SET NOT NULL,
  DROP COLUMN payload_bytes,
  DROP COLUMN content_type`

// binaryDropFnSQL drops the SQL emit function for binary payloads.
const binaryDropFnSQL = `DROP FUNCTION IF EXISTS {{emit_bytes_fn}}(uuid, text, bytea, text, jsonb)`

var _ = sqltext.Register("migrate", map[string]string{
	"binaryStateSQL": binaryStateSQL, "binaryLockTimeoutSQL": binaryLockTimeoutSQL,
	"binaryAddSQL": binaryAddSQL, "binaryAddParkedSQL": binaryAddParkedSQL, "binaryValidateSQL": binaryValidateSQL,
	"binaryRowsSQL": binaryRowsSQL, "binaryJSONOnlySQL": binaryJSONOnlySQL, "binaryDeleteDispatchedSQL": binaryDeleteDispatchedSQL,
	"binaryValidateJSONOnlySQL": binaryValidateJSONOnlySQL, "binaryDropSQL": binaryDropSQL,
	"binaryDropParkedSQL": binaryDropParkedSQL, "binaryDropFnSQL": binaryDropFnSQL,
	"binaryMarkSQL": binaryMarkSQL, "binaryUnmarkSQL": binaryUnmarkSQL,
})
