package switchover

import (
	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/sqltext"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// The statements of switching an outbox between its sources, rendered per
// call by render for the tables the switch was given; internal/sqltext's
// plan test EXPLAINs each of them.

// switchSetupStateSQL says whether the publication ($1) and the slot ($2)
// exist. Catalogs only.
const switchSetupStateSQL = `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
  EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $2)`

// switchSlotSQL reads a slot of this database, its reader's
// application_name (pg_stat_activity shows it to every role), and whether
// its confirmed position has passed the WAL position $2 (false when $2 is
// NULL, or while the slot is being created). Catalog views, no index.
const switchSlotSQL = `SELECT coalesce(s.wal_status, ''), s.active, coalesce(s.active_pid, 0), coalesce(a.application_name, ''),
  coalesce(s.confirmed_flush_lsn, '0/0'::pg_lsn)::text, coalesce(s.confirmed_flush_lsn >= $2::pg_lsn, false)
FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
WHERE s.slot_name = $1 AND s.database = current_database()`

// switchCutSQL is the poll -> WAL cut, read once the slot exists: the
// highest id committed, from the end of the primary key.
const switchCutSQL = `SELECT coalesce(max(id), 0) FROM {{outbox}}`

// switchPendingSQL counts the rows up to the cut ($1) still pending, and
// those of them whose aggregate has a held row (heldRowsSQL): the held
// row itself, its aggregate's oldest pending one, and the rows behind it.
// The pending index, from its start to the cut.
const switchPendingSQL = `WITH held AS MATERIALIZED (SELECT coalesce(array_agg(aggregate_id), '{}') AS aggs FROM (` + sqltext.HeldRows + `) h)
SELECT count(*), count(*) FILTER (WHERE aggregate_id = ANY((SELECT aggs FROM held)::uuid[]))
FROM {{outbox}} WHERE dispatched_at IS NULL AND id <= $1`

// switchHeldSQL lists the held rows up to the cut ($1), at most $2, with
// their failure: the failures table is tiny, and each of its rows finds
// its outbox row by primary key.
const switchHeldSQL = `SELECT o.id, o.aggregate_id, o.type, o.created_at,
  extract(epoch FROM now() - coalesce(o.requeued_at, o.created_at))::float8,
  f.reason, f.error, f.attempts, f.failed_at, f.held_until
FROM {{failures}} f JOIN {{outbox}} o ON o.id = f.event_id
WHERE o.dispatched_at IS NULL AND f.failed_at >= coalesce(o.requeued_at, o.created_at) AND o.id <= $1
ORDER BY o.id
LIMIT $2`

// switchWALPositionSQL reads the WAL insert position. As the first
// statement of the WAL -> poll marking transaction (REPEATABLE READ) it
// is the cut: it takes the transaction's snapshot before it reads the
// position, so every row the snapshot sees committed before it.
const switchWALPositionSQL = `SELECT pg_current_wal_insert_lsn()::text`

// switchNudgeSQL writes what the WAL relay's heartbeat writes, a
// non-transactional logical message: the relayer confirms past it once
// the broker has everything before it, so the slot passes a cut without
// waiting for the relay's next heartbeat.
const switchNudgeSQL = `SELECT pg_logical_emit_message(false, '` + walrelay.HeartbeatPrefix + `', '')`

// switchMarkSQL marks dispatched every pending row the marking
// transaction's snapshot sees (the WAL source published them): the
// pending index, whole.
const switchMarkSQL = `UPDATE {{outbox}} SET dispatched_at = now() WHERE dispatched_at IS NULL`

var _ = sqltext.Register("switchover", map[string]string{
	"switchSetupStateSQL": switchSetupStateSQL, "switchSlotSQL": switchSlotSQL, "switchCutSQL": switchCutSQL,
	"switchPendingSQL": switchPendingSQL, "switchHeldSQL": switchHeldSQL, "switchWALPositionSQL": switchWALPositionSQL,
	"switchNudgeSQL": switchNudgeSQL, "switchMarkSQL": switchMarkSQL,
})

// render fills a statement's placeholders with tables' quoted names.
func render(sql string, tables outbox.Tables) string {
	tables = tables.WithDefaults()
	return sqltext.Render(sql, sqltext.For(tables.Schema, tables.Outbox, tables.Processed))
}
