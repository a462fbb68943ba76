package walrelay

import (
	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/sqltext"
)

// parkSQL moves an event the broker refused for good (or the relayer could
// not decode) into the parked table, with the reason, so the stream can go
// on; its row leaves the outbox in the same statement (plain-insert mode;
// in the other modes there is none), so that `outbox events unpark` can
// put it back under its id, which is a new insert in the WAL and publishes
// it again. ON CONFLICT: an event read again after a crash, parked
// already. Parameters: $1 id, $2 aggregate, $3 type, $4 payload and $5
// headers (JSON text, $5 NULL for none), $6 created_at, $7 reason, $8
// error.
const parkSQL = `WITH gone AS (
  DELETE FROM {{outbox}} WHERE id = $1
)
INSERT INTO {{parked}} (id, aggregate_id, type, payload, headers, created_at, reason, last_error)
VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, $6, $7, $8)
ON CONFLICT (id) DO NOTHING`

// parkRawSQL is parkSQL for an event whose payload or headers are not
// JSON: they are kept as JSON strings, so that the parked row holds what
// arrived.
const parkRawSQL = `WITH gone AS (
  DELETE FROM {{outbox}} WHERE id = $1
)
INSERT INTO {{parked}} (id, aggregate_id, type, payload, headers, created_at, reason, last_error)
VALUES ($1, $2, $3, to_jsonb($4::text), to_jsonb($5::text), $6, $7, $8)
ON CONFLICT (id) DO NOTHING`

// parkBinarySQL is parkSQL for an event with a binary payload (an outbox
// with binary payloads on): the bytes and their content type go to the
// parked table's payload_bytes and content_type, so that unparking puts
// the row back whole. Parameters: parkSQL's, $4 the bytes, and $9 the
// content type.
const parkBinarySQL = `WITH gone AS (
  DELETE FROM {{outbox}} WHERE id = $1
)
INSERT INTO {{parked}} (id, aggregate_id, type, payload_bytes, content_type, headers, created_at, reason, last_error)
VALUES ($1, $2, $3, $4::bytea, $9::text, $5::jsonb, $6, $7, $8)
ON CONFLICT (id) DO NOTHING`

// heartbeatSQL writes the heartbeat: non-transactional, so it is decoded
// at once, on its own, whatever else is open.
const heartbeatSQL = `SELECT pg_logical_emit_message(false, '` + HeartbeatPrefix + `', '')`

// leaderLockSQL tries the leader's session lock (lockkey.WALSlot).
const leaderLockSQL = `SELECT pg_try_advisory_lock($1, $2)`

// leaderIdleSQL ends the leader's lock session when it stays idle for $1
// (idle_session_timeout, Postgres 14 and later): the leader pings it
// every half LeaderPollInterval, so only a leader that stopped running
// (paused, frozen) lets it lapse, and its lock then goes to a standby. The
// kernel of a paused process still answers TCP keepalives: without this,
// such a leader would keep the lock until it ran again.
const leaderIdleSQL = `SELECT set_config('idle_session_timeout', $1, false)`

// takeSlotSQL ends the walsender of a previous leader's stream, which
// still reads the slot after its leader lost the lock (paused, or cut
// off before the server noticed). Only the new leader runs it, holding
// the lock, and only on a process named as a relayer's stream.
const takeSlotSQL = `SELECT pg_terminate_backend($1)`

// slotSQL reads the slot's state before streaming.
const slotSQL = `SELECT coalesce(wal_status, ''), active_pid, coalesce(confirmed_flush_lsn, '0/0'::pg_lsn)::text, plugin, database = current_database()
FROM pg_replication_slots WHERE slot_name = $1`

// publicationTablesSQL reads whether publication $1 exists, whether it
// publishes inserts, and its tables as schema.table (every table for a
// FOR ALL TABLES publication).
const publicationTablesSQL = `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
  coalesce((SELECT pubinsert FROM pg_publication WHERE pubname = $1), false),
  coalesce((SELECT array_agg(schemaname::text || '.' || tablename::text ORDER BY 1) FROM pg_publication_tables WHERE pubname = $1), '{}')`

// partitionedSQL reads whether the table $1 (quoted) is partitioned.
const partitionedSQL = `SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)`

// publicationViaRootSQL reads whether publication $1 publishes partitions'
// changes as their root's, and whether slot $2 exists.
const publicationViaRootSQL = `SELECT coalesce((SELECT pubviaroot FROM pg_publication WHERE pubname = $1), false),
  EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $2)`

// publicationRootSQL reads whether publication $1 publishes partitions'
// changes as their root's, and whether the outbox table $2 (quoted) is
// partitioned.
const publicationRootSQL = `SELECT coalesce((SELECT pubviaroot FROM pg_publication WHERE pubname = $1), false),
  coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($2)), false)`

// publicationFilterSQL reads whether publication $1 publishes only some
// rows (a WHERE clause) or some columns (a column list) of the table $2:
// Postgres 15 and later have both (pg_publication_rel.prqual, prattrs).
const publicationFilterSQL = `SELECT coalesce(bool_or(pr.prqual IS NOT NULL), false), coalesce(bool_or(pr.prattrs IS NOT NULL), false)
  FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
  WHERE p.pubname = $1 AND pr.prrelid = $2::regclass`

// slotHomeSQL reads a slot's database and plugin, and this session's
// database.
const slotHomeSQL = `SELECT coalesce(database::text, ''), plugin::text, current_database()::text FROM pg_replication_slots WHERE slot_name = $1`

// publicationMarkerSQL reads the publication's comment, Setup's marker
// that the slot was created (slotMarker); no row, or NULL, for none.
const publicationMarkerSQL = `SELECT (SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1)`

// streamHolderSQL reads the application_name of the process reading the
// slot, to tell a WAL relayer's stream from a foreign reader.
const streamHolderSQL = `SELECT coalesce((SELECT application_name FROM pg_stat_activity WHERE pid = $1), '')`

var _ = sqltext.Register("walrelay", map[string]string{
	"parkSQL": parkSQL, "parkRawSQL": parkRawSQL, "parkBinarySQL": parkBinarySQL, "heartbeatSQL": heartbeatSQL, "leaderLockSQL": leaderLockSQL, "slotSQL": slotSQL, "publicationMarkerSQL": publicationMarkerSQL, "streamHolderSQL": streamHolderSQL,
	"leaderIdleSQL": leaderIdleSQL, "takeSlotSQL": takeSlotSQL,
	"partitionedSQL": partitionedSQL, "publicationViaRootSQL": publicationViaRootSQL, "publicationRootSQL": publicationRootSQL,
	"emitMessageACLSQL": emitMessageACLSQL, "publicationTablesSQL": publicationTablesSQL, "publicationFilterSQL": publicationFilterSQL, "slotHomeSQL": slotHomeSQL, "legacySQL": legacySQL, "emitMessageFuncsSQL": emitMessageFuncsSQL,
})

func render(sql string, t outbox.Tables) string {
	t = t.WithDefaults()
	return sqltext.Render(sql, sqltext.For(t.Schema, t.Outbox, t.Processed))
}

// pendingBeforeSlotSQL counts the outbox's pending rows and their id
// range, in the snapshot of a new slot's starting point (Setup): events
// committed before the slot, which it lacks, that no polling relayer
// dispatched. Served by the pending index {{pending_idx}}, (id) WHERE
// dispatched_at IS NULL.
const pendingBeforeSlotSQL = `SELECT count(*), coalesce(min(id), 0), coalesce(max(id), 0) FROM {{outbox}} WHERE dispatched_at IS NULL`

var _ = sqltext.Register("walrelay", map[string]string{"pendingBeforeSlotSQL": pendingBeforeSlotSQL})
