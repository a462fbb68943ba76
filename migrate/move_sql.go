package migrate

import "github.com/pgoutbox/outbox/internal/sqltext"

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

// publishedSQL tells whether the outbox table is in a publication (the
// WAL source relays it).
const publishedSQL = `SELECT EXISTS (SELECT FROM pg_catalog.pg_publication_rel WHERE prrelid = '{{outbox}}'::regclass)`

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
	"publishedSQL": publishedSQL, "moveBlockersSQL": moveBlockersSQL, "pendingCountSQL": pendingCountSQL,
})

var _ = sqltext.RegisterTemplates("migrate", map[string]string{
	"addBoundSQL": addBoundSQL, "renameOutboxSQL": renameOutboxSQL, "renameConstraintSQL": renameConstraintSQL,
	"renameIndexSQL": renameIndexSQL, "twinUnboundSQL": twinUnboundSQL, "attachOldSQL": attachOldSQL, "republishSQL": republishSQL,
	"createPlainSQL": createPlainSQL, "copyPendingSQL": copyPendingSQL, "dropRetiredSQL": dropRetiredSQL,
})
