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
// 999999 up are settings, not migrations (999999: the partitioned layout,
// 1000000: binary payloads).
const currentSQL = `SELECT coalesce(max(version), 0) FROM {{migrations}} WHERE version < 999999`

// existsSQL tells whether the bookkeeping table exists (a database never
// migrated has none); $1 is its quoted name.
const existsSQL = `SELECT to_regclass($1) IS NOT NULL`

// appliedSQL lists the applied versions in order.
const appliedSQL = `SELECT version, applied_at FROM {{migrations}} WHERE version < 999999 ORDER BY version`

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

// idSeqCacheSQL reads the sequence behind the outbox's id column and how
// many ids it caches per session (sequence.go): the sequence the column
// owns (pg_get_serial_sequence of $1, the quoted outbox table: BIGSERIAL,
// or the partitioned layout's, given to the partitioned table), else the
// one named as BIGSERIAL names it ($2, quoted). Catalog lookups by oid.
const idSeqCacheSQL = `SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname), s.seqcache
FROM pg_catalog.pg_sequence s
JOIN pg_catalog.pg_class c ON c.oid = s.seqrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE s.seqrelid = coalesce(pg_catalog.pg_get_serial_sequence($1, 'id')::regclass, pg_catalog.to_regclass($2))`

var _ = sqltext.Register("migrate", map[string]string{"idSeqCacheSQL": idSeqCacheSQL})

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

// The partitioned layout (partitioned.go): an optional setting of one
// outbox table, applied after the numbered migrations. The statements that
// name a table known only when they run (the partitioned twin, a
// partition) are templates (sqltext.RegisterTemplates): their %s are
// quoted identifiers, their %d numbers.

// layoutSQL reads whether the outbox table $1 (quoted) is partitioned.
const layoutSQL = `SELECT coalesce((SELECT relkind = 'p' FROM pg_catalog.pg_class WHERE oid = to_regclass($1)), false)`

// partitionSettingsSQL reads the partitioned layout's settings and the
// partition a retention run left half done: the table's one row.
const partitionSettingsSQL = `SELECT width, (extract(epoch FROM ahead) * 1000000)::bigint, detaching, detaching_from, detaching_to FROM {{partitioning}}`

// lockOutboxSQL takes the outbox table for the transaction that replaces
// it: nothing inserts into it meanwhile (under binaryLockTimeoutSQL).
const lockOutboxSQL = `LOCK TABLE {{outbox}} IN ACCESS EXCLUSIVE MODE`

// nextIDSQL reads the id the sequence hands out next.
const nextIDSQL = `SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM {{id_seq}}`

// partitionRefuseSQL refuses (SQLSTATE P0001) to replace an outbox table
// that holds rows (a seq scan that stops at the first row), that is in a
// publication (dropping the table would take it out: the WAL relay would
// stream nothing), or whose sequence hands out an id at or past %d (the
// partitions the script makes would not hold it).
const partitionRefuseSQL = `DO $refuse$
DECLARE
  pubs text;
BEGIN
  IF EXISTS (SELECT FROM {{outbox}}) THEN
    RAISE EXCEPTION '{{outbox}} holds rows: migrate up --partitioned replaces an empty outbox table only (a fresh install)';
  END IF;
  SELECT string_agg(p.pubname, ', ') INTO pubs
  FROM pg_catalog.pg_publication_rel r JOIN pg_catalog.pg_publication p ON p.oid = r.prpubid
  WHERE r.prrelid = '{{outbox}}'::regclass;
  IF pubs IS NOT NULL THEN
    RAISE EXCEPTION USING MESSAGE = '{{outbox}} is in publication ' || pubs
      || ': drop it first (outbox relay --mode wal --teardown); the WAL relay makes it again for the partitioned table';
  END IF;
  IF (SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM {{id_seq}}) >= %d THEN
    RAISE EXCEPTION 'the id sequence {{id_seq}} is past the partitions this script makes: run outbox migrate up --partitioned instead, which starts them at the sequence';
  END IF;
END
$refuse$`

// createPartitionedSQL creates the partitioned twin of the outbox table
// (the twin, its primary key's name): the outbox's columns with their
// defaults (the id sequence's nextval), NOT NULLs, CHECK constraints
// (binary payloads'), storage and comments, and the primary key on id, a
// partitioned index that is unique across partitions because id is the
// partition key.
const createPartitionedSQL = `CREATE TABLE %s (LIKE {{outbox}} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION INCLUDING COMMENTS,
  CONSTRAINT %s PRIMARY KEY (id)) PARTITION BY RANGE (id)`

// createPendingSQL is migration 1's pending index on the twin (the index,
// the twin): a partitioned index, made on every partition as it is
// attached, so the claim walks each partition's pending rows in id order
// and stops at the batch, partition after partition.
const createPendingSQL = `CREATE INDEX %s ON %s (id) WHERE dispatched_at IS NULL`

// copyTriggersSQL copies the outbox table's triggers (the insert guard,
// and any of the application's own) with their comments to the twin (%s,
// in a string literal: validated names hold no quote). Each is the
// catalog's own definition with the table it is on replaced, printed and
// run under search_path pg_catalog so that every name in it is
// qualified.
const copyTriggersSQL = `DO $copy$
DECLARE
  t    record;
  path text := current_setting('search_path');
BEGIN
  PERFORM set_config('search_path', 'pg_catalog', true);
  FOR t IN SELECT tr.oid, tr.tgname::text AS name, obj_description(tr.oid, 'pg_trigger') AS comment
    FROM pg_trigger tr WHERE tr.tgrelid = '{{outbox}}'::regclass AND NOT tr.tgisinternal ORDER BY tr.tgname
  LOOP
    EXECUTE replace(pg_get_triggerdef(t.oid), ' ON ' || '{{outbox}}'::regclass::text || ' ', ' ON ' || '%[1]s'::regclass::text || ' ');
    IF t.comment IS NOT NULL THEN
      EXECUTE 'COMMENT ON TRIGGER ' || quote_ident(t.name) || ' ON ' || '%[1]s'::regclass::text || ' IS ' || quote_literal(t.comment);
    END IF;
  END LOOP;
  PERFORM set_config('search_path', path, true);
END
$copy$`

// copyGrantsSQL grants on the twin (%s) what is granted on the outbox
// table (producers' INSERT, the relay's SELECT and UPDATE, ...), and
// copies the table's comment. Queries through the partitioned table are
// checked against its grants alone.
const copyGrantsSQL = `DO $grant$
DECLARE
  g record;
BEGIN
  FOR g IN SELECT a.privilege_type, a.grantee, a.is_grantable
    FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
    WHERE c.oid = '{{outbox}}'::regclass AND a.grantee <> c.relowner
  LOOP
    EXECUTE 'GRANT ' || g.privilege_type || ' ON %[1]s TO '
      || CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END
      || CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END;
  END LOOP;
  EXECUTE 'COMMENT ON TABLE %[1]s IS ' || quote_nullable(obj_description('{{outbox}}'::regclass, 'pg_class'));
END
$grant$`

// guardRootSQL makes the insert guard's function (migration 7) name the
// outbox table in its errors when it fires on a partition: a trigger on a
// partitioned table runs on the partition a row lands in, whose name is
// TG_TABLE_NAME, and the guard's errors carry the violated rule as
// <outbox>_type_topic or <outbox>_headers_shape in their constraint name
// and the table in their TABLE field (what producers match on). The
// function is read from the catalog and its reads of the table's name
// and owner are pointed at the partition tree's root, which is the table
// itself for a plain one; it runs only for rows the trigger's WHEN
// refuses, so inserts pay nothing for it. Idempotent: Up runs it again
// after a migration that may have replaced the function.
const guardRootSQL = `DO $guard$
DECLARE
  def text := pg_catalog.pg_get_functiondef('{{guard_fn}}()'::pg_catalog.regprocedure);
BEGIN
  IF position('pg_partition_root' IN def) > 0 THEN
    RETURN;
  END IF;
  IF position('c.oid = TG_RELID' IN def) = 0 OR position('TG_TABLE_NAME' IN def) = 0 THEN
    RAISE EXCEPTION 'the insert guard {{guard_fn}} is not the one migration 7 made: it cannot be pointed at the partitioned table';
  END IF;
  def := replace(def, 'c.oid = TG_RELID', 'c.oid = coalesce(pg_catalog.pg_partition_root(TG_RELID), TG_RELID)');
  def := replace(def, 'TG_TABLE_NAME', '(SELECT r.relname FROM pg_catalog.pg_class r WHERE r.oid = coalesce(pg_catalog.pg_partition_root(TG_RELID), TG_RELID))');
  EXECUTE def;
END
$guard$`

// seqUnownSQL and seqOwnSQL detach the id sequence from the plain table
// before it is dropped (DROP TABLE would drop an owned sequence, and
// producers hold USAGE on it), and give it to the partitioned one.
const (
	seqUnownSQL = `ALTER SEQUENCE {{id_seq}} OWNED BY NONE`
	seqOwnSQL   = `ALTER SEQUENCE {{id_seq}} OWNED BY {{outbox}}.id`
)

// dropOutboxSQL drops the plain, empty outbox table, with its indexes and
// triggers.
const dropOutboxSQL = `DROP TABLE {{outbox}}`

// renameTableSQL, renamePKeySQL and renamePendingSQL move the twin into
// the outbox table's place: its name (the twin, the outbox's bare name),
// its primary key's (old, new) and its pending index's (the index).
const (
	renameTableSQL   = `ALTER TABLE %s RENAME TO %s`
	renamePKeySQL    = `ALTER TABLE {{outbox}} RENAME CONSTRAINT %s TO %s`
	renamePendingSQL = `ALTER INDEX %s RENAME TO {{pending_idx}}`
)

// createPartitioningSQL makes the partitioned layout's table: one row of
// settings (width: ids per partition, ahead: how long the partitions made
// ahead last), the id sequence's position as last sampled (the rate ids
// are drawn at, rows or not: message-mode events draw ids and write none),
// and retention's state (the partition a run is detaching or dropping,
// the outcome of the last run), read by every process.
const createPartitioningSQL = `CREATE TABLE IF NOT EXISTS {{partitioning}} (
  singleton      boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
  width          bigint      NOT NULL CHECK (width >= 10),
  ahead          interval    NOT NULL CHECK (ahead > interval '0'),
  sampled_at     timestamptz,
  sampled_id     bigint,
  detaching      text,
  detaching_from bigint,
  detaching_to   bigint,
  last_retention jsonb,
  updated_at     timestamptz NOT NULL DEFAULT now()
)`

// insertPartitioningSQL records the settings (width, ahead in
// microseconds), by the table's primary key.
const insertPartitioningSQL = `INSERT INTO {{partitioning}} (width, ahead) VALUES (%d, %d * interval '1 microsecond')
ON CONFLICT (singleton) DO UPDATE SET width = EXCLUDED.width, ahead = EXCLUDED.ahead, updated_at = now()`

// partitionedMarkSQL and partitionedUnmarkSQL write and remove the
// partitioned layout's row in the migrations table (see partitioned.go).
const (
	partitionedMarkSQL   = `INSERT INTO {{migrations}} (version) VALUES (999999) ON CONFLICT DO NOTHING`
	partitionedUnmarkSQL = `DELETE FROM {{migrations}} WHERE version = 999999`
)

// dropPartitioningSQL and dropDetachedSQL (a detached partition) go with
// the outbox table when migration 1 is reverted.
const (
	dropPartitioningSQL = `DROP TABLE IF EXISTS {{partitioning}}`
	dropDetachedSQL     = `DROP TABLE IF EXISTS %s`
)

var _ = sqltext.Register("migrate", map[string]string{
	"layoutSQL": layoutSQL, "partitionSettingsSQL": partitionSettingsSQL, "lockOutboxSQL": lockOutboxSQL, "nextIDSQL": nextIDSQL,
	"guardRootSQL": guardRootSQL, "seqUnownSQL": seqUnownSQL, "seqOwnSQL": seqOwnSQL, "dropOutboxSQL": dropOutboxSQL,
	"createPartitioningSQL": createPartitioningSQL, "partitionedMarkSQL": partitionedMarkSQL, "partitionedUnmarkSQL": partitionedUnmarkSQL,
	"dropPartitioningSQL": dropPartitioningSQL,
})

var _ = sqltext.RegisterTemplates("migrate", map[string]string{
	"partitionRefuseSQL": partitionRefuseSQL, "createPartitionedSQL": createPartitionedSQL, "createPendingSQL": createPendingSQL,
	"copyTriggersSQL": copyTriggersSQL, "copyGrantsSQL": copyGrantsSQL,
	"renameTableSQL": renameTableSQL, "renamePKeySQL": renamePKeySQL, "renamePendingSQL": renamePendingSQL,
	"insertPartitioningSQL": insertPartitioningSQL, "dropDetachedSQL": dropDetachedSQL,
})

// The statements of a move between the layouts (move.go). Those that name
// a table known only when they run (the twin, the old table's partition
// name, the retired table) are templates: their %s are quoted
// identifiers, their %d numbers.

// createMoveSQL makes the move's record: one row, the last move begun
// (convert: plain to partitioned, revert: back), the step it reached, the
// bound of the old table's partition (convert), and the table a revert
// retired with when, which cleanup drops once the retention has passed.
const createMoveSQL = `CREATE TABLE IF NOT EXISTS {{layout_move}} (
  singleton   boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
  direction   text        NOT NULL CHECK (direction IN ('convert', 'revert')),
  step        text        NOT NULL,
  bound       bigint,
  retired     text,
  retired_at  timestamptz,
  started_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz
)`

// moveExistsSQL tells whether the move's record exists ($1 its quoted
// name): a database no move touched has none.
const moveExistsSQL = `SELECT to_regclass($1) IS NOT NULL`

// readMoveSQL reads the move's record (its one row, by primary key).
const readMoveSQL = `SELECT direction, step, bound, retired, retired_at, started_at, updated_at, finished_at FROM {{layout_move}}`

// beginMoveSQL records a move that begins ($1 direction, $2 step, $3
// bound), replacing the record of a finished one; a retired table not yet
// dropped stays recorded.
const beginMoveSQL = `INSERT INTO {{layout_move}} (direction, step, bound) VALUES ($1, $2, $3)
ON CONFLICT (singleton) DO UPDATE SET direction = EXCLUDED.direction, step = EXCLUDED.step, bound = EXCLUDED.bound,
  started_at = CASE WHEN {{layout_move}}.finished_at IS NULL AND {{layout_move}}.direction = EXCLUDED.direction THEN {{layout_move}}.started_at ELSE now() END,
  updated_at = now(), finished_at = NULL`

// stepMoveSQL records the step a move reached ($1); with $2 set the move
// is finished.
const stepMoveSQL = `UPDATE {{layout_move}} SET step = $1, updated_at = now(), finished_at = CASE WHEN $2::boolean THEN now() END`

// retireSQL records the table a revert retired ($1, unquoted).
const retireSQL = `UPDATE {{layout_move}} SET retired = $1, retired_at = now()`

// unretireSQL clears the retired table once it is dropped.
const unretireSQL = `UPDATE {{layout_move}} SET retired = NULL, retired_at = NULL`

// boundStateSQL reads the outbox table's kind ('r' plain, 'p'
// partitioned), and its bounds constraint (the one a partition of the
// partitioned layout has, partition_bounds): whether it exists and is
// validated. pg_constraint is read by its index on (conrelid, contypid,
// conname).
const boundStateSQL = `SELECT c.relkind::text,
  EXISTS (SELECT FROM pg_catalog.pg_constraint k WHERE k.conrelid = c.oid AND k.conname = 'partition_bounds'),
  coalesce((SELECT k.convalidated FROM pg_catalog.pg_constraint k WHERE k.conrelid = c.oid AND k.conname = 'partition_bounds'), false)
FROM pg_catalog.pg_class c WHERE c.oid = to_regclass($1)`

// addBoundSQL adds the CHECK that proves every row of the plain outbox
// table is below the bound (%d), NOT VALID: ACCESS EXCLUSIVE for an
// instant, no scan. From then on inserts at or past the bound fail.
const addBoundSQL = `ALTER TABLE {{outbox}} ADD CONSTRAINT partition_bounds CHECK (id >= 0 AND id < %d) NOT VALID`

// validateBoundSQL scans the table once to prove the CHECK, under SHARE
// UPDATE EXCLUSIVE: producers, relayers and cleanup go on.
const validateBoundSQL = `ALTER TABLE {{outbox}} VALIDATE CONSTRAINT partition_bounds`

// dropBoundSQL takes the CHECK off again: its bound was about to be
// reached before the swap (the move starts over with a higher one).
const dropBoundSQL = `ALTER TABLE {{outbox}} DROP CONSTRAINT IF EXISTS partition_bounds`

// twinUnboundSQL takes off the partitioned twin (%s) the bounds CHECK it
// copied with the plain table's constraints: on the partitioned table it
// would bind every partition to the old table's range.
const twinUnboundSQL = `ALTER TABLE %s DROP CONSTRAINT partition_bounds`

// pkeyNameSQL reads the name of the primary key of table $1 (quoted).
const pkeyNameSQL = `SELECT conname::text FROM pg_catalog.pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'`

// dropTriggersSQL drops the outbox table's own triggers (the insert
// guard, and any of the application's), once the twin has copies: a
// table attached as a partition gets the partitioned table's triggers,
// and a trigger of the same name on it would refuse the attach.
const dropTriggersSQL = `DO $drop$
DECLARE
  t record;
BEGIN
  FOR t IN SELECT tgname FROM pg_catalog.pg_trigger WHERE tgrelid = '{{outbox}}'::regclass AND NOT tgisinternal AND tgparentid = 0
  LOOP
    EXECUTE 'DROP TRIGGER ' || quote_ident(t.tgname) || ' ON {{outbox}}';
  END LOOP;
END
$drop$`

// renameOutboxSQL renames the outbox table (to the bare name %s), and
// renameConstraintSQL and renameIndexSQL its primary key (old, new) and an
// index (old qualified, new bare).
const (
	renameOutboxSQL     = `ALTER TABLE {{outbox}} RENAME TO %s`
	renameConstraintSQL = `ALTER TABLE {{outbox}} RENAME CONSTRAINT %s TO %s`
	renameIndexSQL      = `ALTER INDEX %s RENAME TO %s`
)

// attachOldSQL attaches the old plain table (%s) as the partition [0,
// bound) of the partitioned outbox: its validated CHECK spares the scan,
// and its primary key and pending index, equal to the partitioned
// table's, are attached to them instead of built.
const attachOldSQL = `ALTER TABLE {{outbox}} ATTACH PARTITION %s FOR VALUES FROM (0) TO (%d)`

// republishSQL points every publication of the table %s (the old one,
// by its oid: a publication names tables by oid) at the outbox table, and
// with %s (a WITH clause, or nothing) sets its options: the WAL source
// then decodes every insert committed after the swap as the outbox's,
// and every one before it as it did.
const republishSQL = `DO $pub$
DECLARE
  p record;
BEGIN
  FOR p IN SELECT pub.pubname FROM pg_catalog.pg_publication_rel r JOIN pg_catalog.pg_publication pub ON pub.oid = r.prpubid
    WHERE r.prrelid = '%[1]s'::regclass
  LOOP
    EXECUTE 'ALTER PUBLICATION ' || quote_ident(p.pubname) || ' SET TABLE {{outbox}}';
    EXECUTE 'ALTER PUBLICATION ' || quote_ident(p.pubname) || ' SET (publish_via_partition_root = %[2]s)';
  END LOOP;
END
$pub$`

// moveBlockersSQL reads what keeps a partitioned outbox from being
// reverted: a partition whose concurrent detach is unfinished, and the
// partition retention recorded as being detached.
const moveBlockersSQL = `SELECT
  (SELECT count(*) FROM pg_catalog.pg_inherits WHERE inhparent = '{{outbox}}'::regclass AND inhdetachpending),
  (SELECT detaching FROM {{partitioning}})`

// pendingCountSQL counts the pending rows a revert copies (the pending
// index).
const pendingCountSQL = `SELECT count(*) FROM {{outbox}} WHERE dispatched_at IS NULL`

// createPlainSQL creates the plain twin of a partitioned outbox (the
// twin, its primary key's name): the columns, defaults (the id
// sequence), NOT NULLs, CHECKs and comments, and a primary key on id.
const createPlainSQL = `CREATE TABLE %s (LIKE {{outbox}} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION INCLUDING COMMENTS,
  CONSTRAINT %s PRIMARY KEY (id))`

// copyPendingSQL copies the pending rows into the plain twin (%s) whole,
// ids and all, in id order, before its triggers exist: the guard would
// refuse an id this session did not draw, and these were drawn when they
// were first written (the operator's path, as unpark's is).
const copyPendingSQL = `INSERT INTO %s SELECT * FROM {{outbox}} WHERE dispatched_at IS NULL ORDER BY id`

// dropRetiredSQL drops the table a revert retired, with its partitions.
const dropRetiredSQL = `DROP TABLE IF EXISTS %s`

var _ = sqltext.Register("migrate", map[string]string{
	"createMoveSQL": createMoveSQL, "moveExistsSQL": moveExistsSQL, "readMoveSQL": readMoveSQL, "beginMoveSQL": beginMoveSQL,
	"stepMoveSQL": stepMoveSQL, "retireSQL": retireSQL, "unretireSQL": unretireSQL, "boundStateSQL": boundStateSQL,
	"validateBoundSQL": validateBoundSQL, "dropBoundSQL": dropBoundSQL, "pkeyNameSQL": pkeyNameSQL, "dropTriggersSQL": dropTriggersSQL,
	"moveBlockersSQL": moveBlockersSQL, "pendingCountSQL": pendingCountSQL,
})

var _ = sqltext.RegisterTemplates("migrate", map[string]string{
	"addBoundSQL": addBoundSQL, "renameOutboxSQL": renameOutboxSQL, "renameConstraintSQL": renameConstraintSQL,
	"renameIndexSQL": renameIndexSQL, "twinUnboundSQL": twinUnboundSQL, "attachOldSQL": attachOldSQL, "republishSQL": republishSQL,
	"createPlainSQL": createPlainSQL, "copyPendingSQL": copyPendingSQL, "dropRetiredSQL": dropRetiredSQL,
})
