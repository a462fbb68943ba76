package ops

import (
	"strings"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/sqltext"
)

// Every statement of the operations verbs, rendered per call by render for
// the tables the verb was given. The outbox table has two indexes, the
// primary key (id) and the pending index (id) WHERE dispatched_at IS NULL;
// each comment says which one serves its statement. The failures and
// parked tables are read by their primary keys (event_id, id).
// internal/sqltext's plan test EXPLAINs each of them.

// Lag, held rows and stats (ReadLag, ReadStats).

// heldRowsSQL is what makes a pending row held (sqltext.HeldRows).
const heldRowsSQL = sqltext.HeldRows

// lagSQL reads only pending rows, through the partial index (id) WHERE
// dispatched_at IS NULL: its cost follows the backlog, not the table, so it
// is cheap enough to run every few seconds. min(created_at), not the
// created_at of the lowest id: ids are taken at insert and created_at at
// transaction start, so a long transaction can hold an older row at a
// higher id. A requeued row counts from its requeued_at. Held rows, and the rows of their aggregates (all behind
// them: a held row is its aggregate's oldest pending row), are stuck at
// once, whatever their age. $1 is StuckAfter in microseconds.
const lagSQL = `WITH held AS MATERIALIZED (SELECT coalesce(array_agg(aggregate_id), '{}') AS aggs FROM (` + heldRowsSQL + `) h)
SELECT
  count(*),
  count(*) FILTER (WHERE coalesce(requeued_at, created_at) < now() - $1::bigint * interval '1 microsecond' OR aggregate_id = ANY((SELECT aggs FROM held)::uuid[])),
  coalesce(extract(epoch FROM now() - min(coalesce(requeued_at, created_at))), 0)::float8
FROM {{outbox}} WHERE dispatched_at IS NULL`

// heldSQL counts held rows by reason, with the oldest first failure.
const heldSQL = `SELECT reason, count(*), extract(epoch FROM now() - min(first_failed_at))::float8
FROM (` + heldRowsSQL + `) h GROUP BY reason`

// rateSQL counts recent dispatches over a primary-key range starting at the
// first row created within RateWindow. $1 first id, $2 the server's now().
const rateSQL = `SELECT
  count(*) FILTER (WHERE dispatched_at > $2::timestamptz - interval '1 minute'),
  count(*) FILTER (WHERE dispatched_at > $2::timestamptz - interval '1 hour')
FROM {{outbox}} WHERE id >= $1`

// tableSQL reads size and tuple counts; $1 is the quoted table name. A
// partitioned table is the sum of its partitions (it stores nothing
// itself), its vacuums the latest of theirs.
const tableSQL = `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint, coalesce(sum(s.n_live_tup), 0)::bigint, coalesce(sum(s.n_dead_tup), 0)::bigint,
  max(s.last_vacuum), max(s.last_autovacuum)
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = $1::regclass OR c.oid IN (SELECT relid FROM pg_partition_tree($1::regclass))`

// serverNowSQL reads the server's clock, which the dispatch windows are
// measured against.
const serverNowSQL = `SELECT now()`

// idRangeSQL reads both ends of the primary key.
const idRangeSQL = `SELECT min(id), max(id) FROM {{outbox}}`

// idProbeSQL is one probe of firstIDCreatedSince's binary search: the first
// row at or after an id, one primary-key lookup.
const idProbeSQL = `SELECT id, created_at FROM {{outbox}} WHERE id >= $1 ORDER BY id LIMIT 1`

// The watchdog (Check).

// stuckSQL is the seed's watchdog query with what an operator needs next:
// the recorded failure and the row an aggregate waits behind. It walks the
// pending index in id order and stops at the limit; BlockedBy walks the same
// index from its start to the aggregate's first pending row, which is no
// later than the stuck row itself. Held rows (heldRowsSQL) and the rows of
// their aggregates are stuck whatever their age, as in lagSQL. $1
// StuckAfter in microseconds, $2 limit.
const stuckSQL = `WITH held AS MATERIALIZED (SELECT coalesce(array_agg(aggregate_id), '{}') AS aggs FROM (` + heldRowsSQL + `) h)
SELECT o.id, o.aggregate_id, o.type, o.created_at,
  extract(epoch FROM now() - coalesce(o.requeued_at, o.created_at))::float8,
  (SELECT min(p.id) FROM {{outbox}} p WHERE p.aggregate_id = o.aggregate_id AND p.dispatched_at IS NULL),
  f.reason, f.error, f.attempts, f.failed_at, f.held_until
FROM {{outbox}} o LEFT JOIN {{failures}} f ON f.event_id = o.id AND f.failed_at >= coalesce(o.requeued_at, o.created_at)
WHERE o.dispatched_at IS NULL
  AND (coalesce(o.requeued_at, o.created_at) < now() - $1::bigint * interval '1 microsecond' OR o.aggregate_id = ANY((SELECT aggs FROM held)::uuid[]))
ORDER BY o.id
LIMIT $2`

// Cleanup.

// cleanupCutoffsSQL turns the retentions ($1 outbox, $2 processed, in
// microseconds) into server times.
const cleanupCutoffsSQL = `SELECT now() - $1::bigint * interval '1 microsecond', now() - $2::bigint * interval '1 microsecond'`

// outboxCleanupSQL deletes the old dispatched rows among the next $2 rows
// of the primary key after id $1 (the window), and reports how many it
// deleted, how many it looked at, the last id it looked at and whether it
// reached rows created after the cutoff $3.
//
// There is no index on dispatched_at: old dispatched rows sit at the low
// end of the primary key, so the job walks it from the start in windows
// of $2 rows, each statement one bounded index range scan whatever the
// table's size. It stops at the first window holding a row created after
// the cutoff: rows after it are younger than the retention (a row is
// dispatched after it is created), so the last batch does not scan the
// recent part of the table. A rare row created before the cutoff but
// numbered after that (a long inserting transaction) waits for the next
// run.
//
// dispatched_at < $3 is repeated on the DELETE itself so that Postgres
// re-checks it on the row's latest version should it have changed after
// the window's snapshot: a pending row (dispatched_at NULL) can never
// match, whatever a relayer does to it meanwhile.
const outboxCleanupSQL = `WITH win AS MATERIALIZED (
  SELECT id, created_at, dispatched_at FROM {{outbox}}
  WHERE id > $1
  ORDER BY id
  LIMIT $2
), del AS (
  DELETE FROM {{outbox}} o
  WHERE o.id = ANY(ARRAY(SELECT id FROM win WHERE dispatched_at < $3)) AND o.dispatched_at < $3
  RETURNING 1
)
SELECT (SELECT count(*) FROM del), (SELECT count(*) FROM win),
  coalesce((SELECT max(id) FROM win), $1),
  coalesce((SELECT bool_or(created_at >= $3) FROM win), false)`

// processedCleanupSQL deletes the oldest $2 dedupe rows processed before
// $1, walking the processed_at index from $3 (the last batch's newest
// processed_at: a keyset, so no batch re-walks the dead index entries its
// predecessors left). Returns the count and the newest processed_at
// deleted.
const processedCleanupSQL = `WITH doomed AS MATERIALIZED (
  SELECT consumer, source, event_id, processed_at FROM {{processed}}
  WHERE processed_at >= $3 AND processed_at < $1
  ORDER BY processed_at
  LIMIT $2
), del AS (
  DELETE FROM {{processed}} p USING doomed d
  WHERE p.consumer = d.consumer AND p.source = d.source AND p.event_id = d.event_id AND p.processed_at < $1
  RETURNING p.processed_at
)
SELECT count(*), max(processed_at) FROM del`

// pruneFailuresSQL drops failure records of rows that are no longer
// pending (dispatched at last, or deleted by hand). The failures table
// holds a handful of rows; each is one primary-key probe.
const pruneFailuresSQL = `DELETE FROM {{failures}} f
WHERE NOT EXISTS (SELECT 1 FROM {{outbox}} o WHERE o.id = f.event_id AND o.dispatched_at IS NULL)`

// The event verbs (outbox events show, retry, park, unpark, replay).

// showSQL reads one outbox row by primary key, with its failure record (by
// the failures table's primary key) and, for a pending row, the earliest
// pending row of its aggregate before it. That walks the pending index
// (id) WHERE dispatched_at IS NULL from its start up to the row and stops
// at the first row of the aggregate, as the watchdog's BlockedBy does:
// there is no index on aggregate_id (migration 3 dropped it). $1 id, $2 how
// many characters of the payload text to return (-1: all).
const showSQL = `SELECT o.id, o.aggregate_id, o.type, o.created_at, o.dispatched_at,
  octet_length(o.payload::text),
  CASE WHEN $2::int < 0 THEN o.payload::text ELSE left(o.payload::text, $2::int) END,
  o.headers::text,
  f.event_id IS NOT NULL, f.reason, f.error, f.attempts, f.first_failed_at, f.failed_at, f.held_until,
  coalesce(o.dispatched_at IS NULL AND f.held_until > now(), false),
  CASE WHEN o.dispatched_at IS NULL THEN (
    SELECT p.id FROM {{outbox}} p
    WHERE p.dispatched_at IS NULL AND p.id < o.id AND p.aggregate_id = o.aggregate_id
    ORDER BY p.id LIMIT 1)
  END
FROM {{outbox}} o LEFT JOIN {{failures}} f ON f.event_id = o.id
WHERE o.id = $1`

// showParkedSQL reads one parked row by the parked table's primary key. $1
// id, $2 as in showSQL.
const showParkedSQL = `SELECT id, aggregate_id, type, created_at,
  octet_length(payload::text),
  CASE WHEN $2::int < 0 THEN payload::text ELSE left(payload::text, $2::int) END,
  headers::text, parked_at, reason, last_error
FROM {{parked}} WHERE id = $1`

// The active holds of one event (the failures table's primary key) or of
// one aggregate (no index: the failures table holds one row per stuck
// event, a handful), each checked against its outbox row by primary key.
// $1 the event id or the aggregate.
const (
	activeHoldsByEventSQL = `SELECT f.event_id, f.aggregate_id, f.type, f.reason, f.error, f.attempts, f.held_until
FROM {{failures}} f
WHERE f.event_id = $1 AND f.held_until > now()
  AND EXISTS (SELECT 1 FROM {{outbox}} o WHERE o.id = f.event_id AND o.dispatched_at IS NULL)
ORDER BY f.event_id`

	activeHoldsByAggregateSQL = `SELECT f.event_id, f.aggregate_id, f.type, f.reason, f.error, f.attempts, f.held_until
FROM {{failures}} f
WHERE f.aggregate_id = $1 AND f.held_until > now()
  AND EXISTS (SELECT 1 FROM {{outbox}} o WHERE o.id = f.event_id AND o.dispatched_at IS NULL)
ORDER BY f.event_id`
)

// The lift statements lift the holds the active-holds statements list, and
// only the hold: the failure's history (reason, error, attempts) stays. The
// rows are locked first so that the reported held_until is the one lifted.
const (
	liftHoldsByEventSQL = `WITH held AS (
  SELECT f.event_id, f.held_until FROM {{failures}} f
  WHERE f.event_id = $1 AND f.held_until > now()
    AND EXISTS (SELECT 1 FROM {{outbox}} o WHERE o.id = f.event_id AND o.dispatched_at IS NULL)
  FOR UPDATE OF f
)
UPDATE {{failures}} f SET held_until = NULL
FROM held WHERE f.event_id = held.event_id
RETURNING f.event_id, f.aggregate_id, f.type, f.reason, f.error, f.attempts, held.held_until`

	liftHoldsByAggregateSQL = `WITH held AS (
  SELECT f.event_id, f.held_until FROM {{failures}} f
  WHERE f.aggregate_id = $1 AND f.held_until > now()
    AND EXISTS (SELECT 1 FROM {{outbox}} o WHERE o.id = f.event_id AND o.dispatched_at IS NULL)
  FOR UPDATE OF f
)
UPDATE {{failures}} f SET held_until = NULL
FROM held WHERE f.event_id = held.event_id
RETURNING f.event_id, f.aggregate_id, f.type, f.reason, f.error, f.attempts, held.held_until`
)

// holdsSQL picks the statement Retry runs: [by event][applied].
var holdsSQL = [2][2]string{
	{activeHoldsByAggregateSQL, liftHoldsByAggregateSQL},
	{activeHoldsByEventSQL, liftHoldsByEventSQL},
}

// notifySQL wakes every relayer listening on the outbox's channel; sent in
// the verb's transaction, it is delivered when the change commits.
const notifySQL = `SELECT pg_notify($1, '')`

// setLockTimeoutSQL bounds how long the verb's transaction waits for a row
// lock; $1 is a duration such as '5000ms'.
const setLockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)`

// lockPendingSQL reads one outbox row by primary key; an applied run adds
// FOR UPDATE (under a lock_timeout) so no relayer claims it meanwhile.
const lockPendingSQL = `SELECT aggregate_id, type, created_at, dispatched_at FROM {{outbox}} WHERE id = $1`

// lockPendingForUpdateSQL is lockPendingSQL as an applied park runs it.
const lockPendingForUpdateSQL = lockPendingSQL + " FOR UPDATE"

// laterPendingSQL counts the pending rows of an aggregate after an id: a
// walk of the pending index (id) WHERE dispatched_at IS NULL from that id
// to its end (no index on aggregate_id). $1 aggregate, $2 id.
const laterPendingSQL = `SELECT count(*) FROM {{outbox}} WHERE dispatched_at IS NULL AND id > $2 AND aggregate_id = $1`

// lastErrorSQL reads an event's recorded failure by primary key.
const lastErrorSQL = `SELECT error FROM {{failures}} WHERE event_id = $1`

// parkSQL moves one pending outbox row (by primary key) into the parked
// table whole, with the reason and the last recorded error, and deletes
// its failure record (by primary key): its hold goes with it. $1 id, $2
// reason.
const parkSQL = `WITH moved AS (
  DELETE FROM {{outbox}} WHERE id = $1 AND dispatched_at IS NULL
  RETURNING id, aggregate_id, type, payload, headers, created_at
), failure AS (
  DELETE FROM {{failures}} WHERE event_id = (SELECT id FROM moved)
  RETURNING error
)
INSERT INTO {{parked}} (id, aggregate_id, type, payload, headers, created_at, reason, last_error)
SELECT id, aggregate_id, type, payload, headers, created_at, $2, (SELECT error FROM failure) FROM moved
RETURNING parked_at, last_error`

// binaryColumnsSQL reads whether the outbox table $1 (its quoted name) has
// binary payloads on (payload_bytes and content_type beside payload; see
// migrate.Migrator.EnableBinaryPayloads): the verbs that move or show a
// row whole then run the statements below that carry those columns too.
const binaryColumnsSQL = `SELECT EXISTS (SELECT FROM pg_catalog.pg_attribute
  WHERE attrelid = to_regclass($1) AND attname = 'payload_bytes' AND NOT attisdropped)`

// parkBinarySQL is parkSQL for an outbox with binary payloads on.
const parkBinarySQL = `WITH moved AS (
  DELETE FROM {{outbox}} WHERE id = $1 AND dispatched_at IS NULL
  RETURNING id, aggregate_id, type, payload, payload_bytes, content_type, headers, created_at
), failure AS (
  DELETE FROM {{failures}} WHERE event_id = (SELECT id FROM moved)
  RETURNING error
)
INSERT INTO {{parked}} (id, aggregate_id, type, payload, payload_bytes, content_type, headers, created_at, reason, last_error)
SELECT id, aggregate_id, type, payload, payload_bytes, content_type, headers, created_at, $2, (SELECT error FROM failure) FROM moved
RETURNING parked_at, last_error`

// unparkBinarySQL is unparkSQL for an outbox with binary payloads on.
const unparkBinarySQL = `WITH p AS (
  DELETE FROM {{parked}} WHERE id = $1
  RETURNING id, aggregate_id, type, payload, payload_bytes, content_type, headers, created_at
), stale AS (
  DELETE FROM {{failures}} WHERE event_id = (SELECT id FROM p)
)
INSERT INTO {{outbox}} (id, aggregate_id, type, payload, payload_bytes, content_type, headers, created_at, requeued_at)
SELECT id, aggregate_id, type, payload, payload_bytes, content_type, headers, created_at, now() FROM p`

// showBinarySQL and showParkedBinarySQL are showSQL and showParkedSQL for
// an outbox with binary payloads on: a binary payload's length is its
// bytes', its text their hex ("\x..."), cut to $2 bytes, and the content
// type comes last. Derived from the two, so they cannot drift apart.
var (
	showBinarySQL       = binaryShow(showSQL, "o.")
	showParkedBinarySQL = binaryShow(showParkedSQL, "")
)

// binaryShow rewrites a show statement's reads of payload, of the table
// aliased by alias ("o." or "").
func binaryShow(sql, alias string) string {
	r := strings.NewReplacer(
		"octet_length("+alias+"payload::text)", "coalesce(octet_length("+alias+"payload::text), octet_length("+alias+"payload_bytes))",
		"CASE WHEN $2::int < 0 THEN "+alias+"payload::text", "CASE WHEN "+alias+"payload_bytes IS NOT NULL THEN '\\x' || encode(CASE WHEN $2::int < 0 THEN "+alias+"payload_bytes ELSE substr("+alias+"payload_bytes, 1, $2::int) END, 'hex') WHEN $2::int < 0 THEN "+alias+"payload::text",
		"\nFROM {{outbox}} o LEFT JOIN", ", o.content_type\nFROM {{outbox}} o LEFT JOIN",
		"\nFROM {{parked}} WHERE", ", content_type\nFROM {{parked}} WHERE",
	)
	return r.Replace(sql)
}

// parkedSQL reads (and in an applied run locks, so two unparks do not
// race) one parked row by primary key.
const parkedSQL = `SELECT aggregate_id, type, created_at, parked_at, reason, last_error FROM {{parked}} WHERE id = $1`

// parkedForUpdateSQL is parkedSQL as an applied unpark runs it.
const parkedForUpdateSQL = parkedSQL + " FOR UPDATE"

// unparkSQL moves a parked row (by primary key) back into the outbox under
// its id, pending, with its created_at, and drops any failure record left
// for that id, so its first try starts afresh.
const unparkSQL = `WITH p AS (
  DELETE FROM {{parked}} WHERE id = $1
  RETURNING id, aggregate_id, type, payload, headers, created_at
), stale AS (
  DELETE FROM {{failures}} WHERE event_id = (SELECT id FROM p)
)
INSERT INTO {{outbox}} (id, aggregate_id, type, payload, headers, created_at, requeued_at)
SELECT id, aggregate_id, type, payload, headers, created_at, now() FROM p`

// replayCountSQL counts, over the primary key range [$1, $2], the
// dispatched rows a replay would set back to pending and the pending ones
// it would leave, with the filters $3 type and $4 aggregate (NULL: any).
const replayCountSQL = `SELECT count(*) FILTER (WHERE dispatched_at IS NOT NULL),
  count(*) FILTER (WHERE dispatched_at IS NULL),
  coalesce(min(id) FILTER (WHERE dispatched_at IS NOT NULL), 0),
  coalesce(max(id) FILTER (WHERE dispatched_at IS NOT NULL), 0)
FROM {{outbox}}
WHERE id >= $1 AND id <= $2 AND ($3::text IS NULL OR type = $3) AND ($4::uuid IS NULL OR aggregate_id = $4)`

// oldestIDSQL is the first entry of the primary key.
const oldestIDSQL = `SELECT coalesce(min(id), 0) FROM {{outbox}}`

// replaySQL sets back to pending the dispatched rows matching the filters
// ($4 type, $5 aggregate; NULL: any) among the next $3 rows of the primary
// key from id $1 up to $2 (a window: one bounded range scan of the primary
// key, whatever the size of the table, the range or the filters' share of
// it), with requeued_at = now(). It returns how many it replayed, their lowest and highest id, how
// many matching rows were pending already, how many rows it looked at and
// the last id it looked at. Rows a relayer is claiming right now look
// pending to it and are left alone: they are being published anyway. A
// failure record left from a replayed row's earlier life (cleanup prunes
// them, but may not have yet) is deleted by primary key, so it neither
// holds the row nor shows as its failure.
const replaySQL = `WITH win AS MATERIALIZED (
  SELECT id, dispatched_at IS NULL AS pending,
    ($4::text IS NULL OR type = $4) AND ($5::uuid IS NULL OR aggregate_id = $5) AS wanted
  FROM {{outbox}}
  WHERE id >= $1 AND id <= $2
  ORDER BY id
  LIMIT $3
), upd AS (
  UPDATE {{outbox}} o SET dispatched_at = NULL, requeued_at = now()
  WHERE o.id = ANY(ARRAY(SELECT id FROM win WHERE wanted AND NOT pending)) AND o.dispatched_at IS NOT NULL
  RETURNING o.id
), stale AS (
  DELETE FROM {{failures}} WHERE event_id = ANY(ARRAY(SELECT id FROM upd))
)
SELECT (SELECT count(*) FROM upd), coalesce((SELECT min(id) FROM upd), 0), coalesce((SELECT max(id) FROM upd), 0),
  (SELECT count(*) FROM win WHERE wanted AND pending), (SELECT count(*) FROM win), coalesce((SELECT max(id) FROM win), $2)`

// WAL mode (ops/wal.go, ops/walcleanup.go).

// walSlotSQL reads a slot of this database. inactive_since only exists
// from PG 17: to_jsonb of the row reads it where it exists and yields
// NULL (and false) elsewhere, in one statement for every version. A
// catalog view, no index involved.
const walSlotSQL = `SELECT coalesce((pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint, 0), coalesce(s.wal_status, ''),
  s.active, coalesce(s.active_pid, 0), coalesce(s.confirmed_flush_lsn, '0/0'::pg_lsn)::text, s.safe_wal_size,
  (to_jsonb(s) ->> 'inactive_since')::timestamptz, to_jsonb(s) ? 'inactive_since',
  current_setting('max_slot_wal_keep_size')
FROM pg_replication_slots s WHERE s.slot_name = $1 AND s.database = current_database()`

// oldestRowSQL reads the age of the lowest id's row (the primary key).
const oldestRowSQL = `SELECT coalesce(extract(epoch FROM now() - (SELECT created_at FROM {{outbox}} ORDER BY id LIMIT 1)), 0)::float8`

// walHorizonSQL: the statement's snapshot is taken before
// pg_current_wal_insert_lsn() is evaluated. The xmin is reduced to its
// 32-bit xid, what the xmin column holds.
const walHorizonSQL = `SELECT pg_current_wal_insert_lsn()::text, (pg_snapshot_xmin(pg_current_snapshot())::text::bigint % 4294967296)`

// walConfirmedSQL reports whether the slot ($1) has confirmed $2, and its
// wal_status; no row when the slot is gone.
const walConfirmedSQL = `SELECT coalesce(confirmed_flush_lsn >= $2::pg_lsn, false), coalesce(wal_status, '')
FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`

// walCleanupSQL is outboxCleanupSQL for a WAL-mode outbox: among the next
// $2 rows of the primary key after id $1, it deletes those created before
// $3 whose inserting transaction precedes xid $4 (modulo 2^32, as
// Postgres compares xids; '2' is a frozen row's, committed before any
// running transaction). A misjudged ancient xmin can only keep a row, never
// delete one committed after the horizon. Served by the primary key.
const walCleanupSQL = `WITH win AS MATERIALIZED (
  SELECT id, created_at, xmin AS x FROM {{outbox}}
  WHERE id > $1
  ORDER BY id
  LIMIT $2
), del AS (
  DELETE FROM {{outbox}} o
  WHERE o.id = ANY(ARRAY(SELECT id FROM win WHERE created_at < $3
    AND (x = '2'::xid OR ((($4::bigint - x::text::bigint) % 4294967296 + 4294967296) % 4294967296) BETWEEN 1 AND 2147483647)))
  RETURNING 1
)
SELECT (SELECT count(*) FROM del), (SELECT count(*) FROM win),
  coalesce((SELECT max(id) FROM win), $1),
  coalesce((SELECT bool_or(created_at >= $3) FROM win), false)`

// Partitioned outboxes (partitions.go, partitionretention.go). The
// partitioned layout's table ({{partitioning}}) is read by its primary key
// (one row); the outbox by ranges of the primary key, one partition's.

// nextIDSQL reads the id the sequence hands out next.
const nextIDSQL = `SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM {{id_seq}}`

// sampledSQL reads the sequence's last recorded position: its age in
// seconds and the id.
const sampledSQL = `SELECT extract(epoch FROM now() - sampled_at)::float8, sampled_id FROM {{partitioning}}`

// resampleSQL is sampledSQL that also records $1, the sequence's next id,
// as the position when the last one is an hour old or missing: a rate
// over one to two hours.
const resampleSQL = `WITH old AS (SELECT sampled_at, sampled_id FROM {{partitioning}}),
upd AS (
  UPDATE {{partitioning}} SET sampled_at = now(), sampled_id = $1
  WHERE sampled_at IS NULL OR sampled_at < now() - interval '1 hour'
)
SELECT extract(epoch FROM now() - sampled_at)::float8, sampled_id FROM old`

// partitionRowsSQL reads one partition's rows through the outbox table,
// over the primary key range [$1, $2): the created_at of its newest row
// (a backward walk of the primary key that stops at once), its pending
// rows (its pending index), which of them are held (the failures table,
// by its primary key range, each checked on the outbox by primary key),
// and the parked rows with ids in the range (the parked table's primary
// key).
const partitionRowsSQL = `SELECT
  (SELECT created_at FROM {{outbox}} WHERE id >= $1 AND id < $2 ORDER BY id DESC LIMIT 1),
  (SELECT count(*) FROM {{outbox}} WHERE id >= $1 AND id < $2 AND dispatched_at IS NULL),
  (SELECT count(*) FROM {{failures}} f JOIN {{outbox}} o ON o.id = f.event_id
   WHERE f.event_id >= $1 AND f.event_id < $2 AND o.dispatched_at IS NULL AND f.failed_at >= coalesce(o.requeued_at, o.created_at)),
  (SELECT count(*) FROM {{parked}} WHERE id >= $1 AND id < $2)`

// setDetachingSQL records the partition a retention run is about to
// detach ($1 its name, $2 and $3 its bounds), or clears it ($1 NULL).
const setDetachingSQL = `UPDATE {{partitioning}} SET detaching = $1, detaching_from = $2, detaching_to = $3`

// recordRetentionSQL records the outcome of a retention run ($1 JSON);
// lastRetentionSQL reads it.
const (
	recordRetentionSQL = `UPDATE {{partitioning}} SET last_retention = $1::jsonb`
	lastRetentionSQL   = `SELECT last_retention FROM {{partitioning}}`
)

// connCheckSQL sets client_connection_check_interval ($1) for the session
// that detaches partitions: a process killed while its DETACH ...
// CONCURRENTLY waits then ends that statement too, instead of leaving it
// to finish unseen; the next run finds the partition detach-pending and
// finishes it.
const connCheckSQL = `SELECT set_config('client_connection_check_interval', $1, false)`

// parkedInRangeSQL counts the parked rows with ids in [$1, $2) (the
// parked table's primary key).
const parkedInRangeSQL = `SELECT count(*) FROM {{parked}} WHERE id >= $1 AND id < $2`

// A partition just detached is a table of its own (the %s), checked
// before it is dropped: under an ACCESS EXCLUSIVE lock, so nothing writes
// it between the check and the drop; its pending rows through its own
// pending index.
const (
	lockDetachedSQL    = `LOCK TABLE %s IN ACCESS EXCLUSIVE MODE`
	detachedPendingSQL = `SELECT count(*) FROM %s WHERE dispatched_at IS NULL`
	dropDetachedSQL    = `DROP TABLE %s`
)

var _ = sqltext.RegisterTemplates("ops", map[string]string{
	"lockDetachedSQL": lockDetachedSQL, "detachedPendingSQL": detachedPendingSQL, "dropDetachedSQL": dropDetachedSQL,
})

var _ = sqltext.Register("ops", map[string]string{
	"nextIDSQL": nextIDSQL, "sampledSQL": sampledSQL, "resampleSQL": resampleSQL, "partitionRowsSQL": partitionRowsSQL,
	"setDetachingSQL": setDetachingSQL, "recordRetentionSQL": recordRetentionSQL, "lastRetentionSQL": lastRetentionSQL,
	"connCheckSQL": connCheckSQL, "parkedInRangeSQL": parkedInRangeSQL,
})

var _ = sqltext.Register("ops", map[string]string{
	"heldRowsSQL": heldRowsSQL, "lagSQL": lagSQL, "heldSQL": heldSQL, "rateSQL": rateSQL, "tableSQL": tableSQL,
	"serverNowSQL": serverNowSQL, "idRangeSQL": idRangeSQL, "idProbeSQL": idProbeSQL,
	"stuckSQL":          stuckSQL,
	"cleanupCutoffsSQL": cleanupCutoffsSQL,
	"outboxCleanupSQL":  outboxCleanupSQL, "processedCleanupSQL": processedCleanupSQL, "pruneFailuresSQL": pruneFailuresSQL,
	"showSQL": showSQL, "showParkedSQL": showParkedSQL,
	"activeHoldsByEventSQL": activeHoldsByEventSQL, "activeHoldsByAggregateSQL": activeHoldsByAggregateSQL,
	"liftHoldsByEventSQL": liftHoldsByEventSQL, "liftHoldsByAggregateSQL": liftHoldsByAggregateSQL,
	"notifySQL": notifySQL, "setLockTimeoutSQL": setLockTimeoutSQL,
	"lockPendingSQL": lockPendingSQL, "lockPendingForUpdateSQL": lockPendingForUpdateSQL,
	"laterPendingSQL": laterPendingSQL, "lastErrorSQL": lastErrorSQL, "parkSQL": parkSQL,
	"parkedSQL": parkedSQL, "parkedForUpdateSQL": parkedForUpdateSQL, "unparkSQL": unparkSQL,
	"binaryColumnsSQL": binaryColumnsSQL, "parkBinarySQL": parkBinarySQL, "unparkBinarySQL": unparkBinarySQL,
	"showBinarySQL": showBinarySQL, "showParkedBinarySQL": showParkedBinarySQL,
	"replayCountSQL": replayCountSQL, "oldestIDSQL": oldestIDSQL, "replaySQL": replaySQL,
	"walSlotSQL": walSlotSQL, "oldestRowSQL": oldestRowSQL,
	"walHorizonSQL": walHorizonSQL, "walConfirmedSQL": walConfirmedSQL, "walCleanupSQL": walCleanupSQL,
})

// render fills a statement's placeholders ({{outbox}}, {{processed}},
// {{failures}}, {{parked}}) with tables' quoted names.
func render(sql string, tables outbox.Tables) string {
	tables = tables.WithDefaults()
	return sqltext.Render(sql, sqltext.For(tables.Schema, tables.Outbox, tables.Processed))
}
