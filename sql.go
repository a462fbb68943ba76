package outbox

import "github.com/pgoutbox/outbox/internal/sqltext"

// Emit's statements insert into the outbox table only: no index is read,
// and each row costs two index inserts (the primary key and the pending
// index (id) WHERE dispatched_at IS NULL, both at the right-hand end).
// NewProducer renders them once; Emit picks one by whether it locks and
// whether it notifies.
//
// The batch insert is one statement so a batch costs one round trip:
//
//  1. the advisory locks, one per aggregate bucket, in ascending key order
//     (so two batches cannot deadlock on each other), are taken in an
//     InitPlan that runs before the first row is produced, hence before any
//     id is drawn from the sequence: a second emitter on the same aggregate
//     waits here until the first commits, and then draws a larger id. That
//     makes id order equal commit order per aggregate;
//  2. rows are inserted in input order (ORDER BY ord; volatile defaults such
//     as nextval are evaluated after the sort), so ids ascend with the input;
//  3. pg_notify is delivered at commit only, and Postgres folds identical
//     notifications of one transaction into one.
//
// Parameters are arrays, which keeps the statement text fixed (one prepared
// statement whatever the batch size) and works through database/sql drivers
// that only send text. $1 the lock namespace, $2 the sorted lock keys (empty
// with the lock off), $3 aggregates, $4 types, $5 payloads, $6 headers (""
// for none), $7 the notification channel.
const (
	insertBatchSQL = `WITH locked AS MATERIALIZED (
  SELECT pg_advisory_xact_lock($1::int4, k) FROM unnest($2::int4[]) WITH ORDINALITY AS l(k, n) ORDER BY n
)
INSERT INTO {{outbox}} (aggregate_id, type, payload, headers)
SELECT e.aggregate_id, e.type, e.payload::jsonb, NULLIF(e.headers, '')::jsonb
FROM unnest($3::uuid[], $4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS e(aggregate_id, type, payload, headers, ord)
WHERE (SELECT count(*) FROM locked) >= 0
ORDER BY e.ord
RETURNING id`

	insertBatchNotifySQL = `WITH locked AS MATERIALIZED (
  SELECT pg_advisory_xact_lock($1::int4, k) FROM unnest($2::int4[]) WITH ORDINALITY AS l(k, n) ORDER BY n
), notified AS MATERIALIZED (SELECT pg_notify($7::text, ''))
INSERT INTO {{outbox}} (aggregate_id, type, payload, headers)
SELECT e.aggregate_id, e.type, e.payload::jsonb, NULLIF(e.headers, '')::jsonb
FROM unnest($3::uuid[], $4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS e(aggregate_id, type, payload, headers, ord)
WHERE (SELECT count(*) FROM locked) >= 0 AND (SELECT count(*) FROM notified) >= 0
ORDER BY e.ord
RETURNING id`
)

// A single event takes the batch's steps without the arrays, which costs
// less per transaction. Parameters: $1 aggregate, $2 type,
// $3 payload, $4 headers ("" for none), then the lock's namespace and key,
// then the notification channel, each when used.
const (
	insertOneSQL = `INSERT INTO {{outbox}} (aggregate_id, type, payload, headers)
SELECT $1::uuid, $2::text, $3::text::jsonb, NULLIF($4::text, '')::jsonb
RETURNING id`

	insertOneLockSQL = `WITH pre AS MATERIALIZED (SELECT pg_advisory_xact_lock($5::int4, $6::int4))
INSERT INTO {{outbox}} (aggregate_id, type, payload, headers)
SELECT $1::uuid, $2::text, $3::text::jsonb, NULLIF($4::text, '')::jsonb FROM pre
RETURNING id`

	insertOneNotifySQL = `WITH pre AS MATERIALIZED (SELECT pg_notify($5::text, ''))
INSERT INTO {{outbox}} (aggregate_id, type, payload, headers)
SELECT $1::uuid, $2::text, $3::text::jsonb, NULLIF($4::text, '')::jsonb FROM pre
RETURNING id`

	insertOneLockNotifySQL = `WITH pre AS MATERIALIZED (SELECT pg_advisory_xact_lock($5::int4, $6::int4), pg_notify($7::text, ''))
INSERT INTO {{outbox}} (aggregate_id, type, payload, headers)
SELECT $1::uuid, $2::text, $3::text::jsonb, NULLIF($4::text, '')::jsonb FROM pre
RETURNING id`
)

// With Config.BinaryPayloads (a table migrated with binary payloads on,
// migrate.Migrator.EnableBinaryPayloads) the inserts also write
// payload_bytes and content_type: a JSON event leaves them NULL, a binary
// one (Bytes) leaves payload NULL; the table's CHECK refuses anything
// else. The parameters are those above with two more after the headers:
// the bytes and the content type ("" for a JSON event; the bytes are then
// ignored), so that the lock's and the channel's move up by two. A
// producer without the setting runs the statements above, unchanged.
const (
	insertBinaryBatchSQL = `WITH locked AS MATERIALIZED (
  SELECT pg_advisory_xact_lock($1::int4, k) FROM unnest($2::int4[]) WITH ORDINALITY AS l(k, n) ORDER BY n
)
INSERT INTO {{outbox}} (aggregate_id, type, payload, headers, payload_bytes, content_type)
SELECT e.aggregate_id, e.type, NULLIF(e.payload, '')::jsonb, NULLIF(e.headers, '')::jsonb,
  CASE WHEN e.content_type <> '' THEN e.bytes END, NULLIF(e.content_type, '')
FROM unnest($3::uuid[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::text[]) WITH ORDINALITY AS e(aggregate_id, type, payload, headers, bytes, content_type, ord)
WHERE (SELECT count(*) FROM locked) >= 0
ORDER BY e.ord
RETURNING id`

	insertBinaryBatchNotifySQL = `WITH locked AS MATERIALIZED (
  SELECT pg_advisory_xact_lock($1::int4, k) FROM unnest($2::int4[]) WITH ORDINALITY AS l(k, n) ORDER BY n
), notified AS MATERIALIZED (SELECT pg_notify($9::text, ''))
INSERT INTO {{outbox}} (aggregate_id, type, payload, headers, payload_bytes, content_type)
SELECT e.aggregate_id, e.type, NULLIF(e.payload, '')::jsonb, NULLIF(e.headers, '')::jsonb,
  CASE WHEN e.content_type <> '' THEN e.bytes END, NULLIF(e.content_type, '')
FROM unnest($3::uuid[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::text[]) WITH ORDINALITY AS e(aggregate_id, type, payload, headers, bytes, content_type, ord)
WHERE (SELECT count(*) FROM locked) >= 0 AND (SELECT count(*) FROM notified) >= 0
ORDER BY e.ord
RETURNING id`

	insertBinaryOneSQL = `INSERT INTO {{outbox}} (aggregate_id, type, payload, headers, payload_bytes, content_type)
SELECT $1::uuid, $2::text, NULLIF($3::text, '')::jsonb, NULLIF($4::text, '')::jsonb, CASE WHEN $6::text <> '' THEN $5::bytea END, NULLIF($6::text, '')
RETURNING id`

	insertBinaryOneLockSQL = `WITH pre AS MATERIALIZED (SELECT pg_advisory_xact_lock($7::int4, $8::int4))
INSERT INTO {{outbox}} (aggregate_id, type, payload, headers, payload_bytes, content_type)
SELECT $1::uuid, $2::text, NULLIF($3::text, '')::jsonb, NULLIF($4::text, '')::jsonb, CASE WHEN $6::text <> '' THEN $5::bytea END, NULLIF($6::text, '') FROM pre
RETURNING id`

	insertBinaryOneNotifySQL = `WITH pre AS MATERIALIZED (SELECT pg_notify($7::text, ''))
INSERT INTO {{outbox}} (aggregate_id, type, payload, headers, payload_bytes, content_type)
SELECT $1::uuid, $2::text, NULLIF($3::text, '')::jsonb, NULLIF($4::text, '')::jsonb, CASE WHEN $6::text <> '' THEN $5::bytea END, NULLIF($6::text, '') FROM pre
RETURNING id`

	insertBinaryOneLockNotifySQL = `WITH pre AS MATERIALIZED (SELECT pg_advisory_xact_lock($7::int4, $8::int4), pg_notify($9::text, ''))
INSERT INTO {{outbox}} (aggregate_id, type, payload, headers, payload_bytes, content_type)
SELECT $1::uuid, $2::text, NULLIF($3::text, '')::jsonb, NULLIF($4::text, '')::jsonb, CASE WHEN $6::text <> '' THEN $5::bytea END, NULLIF($6::text, '') FROM pre
RETURNING id`
)

// The WAL-only modes take no advisory lock and send no NOTIFY: the WAL
// source publishes in commit order and does not listen.
//
// ModeInsertDelete inserts with the statements above and then deletes the
// rows it inserted (by primary key): a data-modifying CTE cannot see the
// rows its sibling inserts, hence a second statement. After a single
// insert, currval is the id this session just drew, which lets Emit send
// both statements in one round trip; it is volatile, so it goes in a
// subquery (one InitPlan) for the primary key to serve the delete: as a
// bare comparison it is evaluated per row, a sequential scan. $1 the ids
// (deleteBatchSQL).
const (
	deleteOneSQL   = `DELETE FROM {{outbox}} WHERE id = (SELECT currval('{{id_seq}}'))`
	deleteBatchSQL = `DELETE FROM {{outbox}} WHERE id = ANY($1::int8[])`
)

// ModeMessage writes one transactional logical message per event, whose
// content walrelay decodes (walrelay.MessagePrefix documents it), through
// <outbox>_emit_message (migration 7): it draws the id from the outbox's
// sequence, so that it never equals a row's and no producer chooses it.
// The batch calls it in input order (a volatile call in the select list
// runs after the sort), so ids ascend with the input and the WAL holds the
// messages (and the WAL source publishes them) in that order. Parameters:
// $1 aggregate, $2 type, $3 payload, $4 headers ("" for none), as arrays
// for the batch.
const (
	messageOneSQL = `SELECT {{emit_message_fn}}($1::uuid, $2::text, $3::text::jsonb, NULLIF($4::text, '')::jsonb)`

	messageBatchSQL = `SELECT {{emit_message_fn}}(e.aggregate_id, e.type, e.payload::jsonb, NULLIF(e.headers, '')::jsonb)
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS e(aggregate_id, type, payload, headers, ord)
ORDER BY e.ord`
)

var _ = sqltext.Register("outbox", map[string]string{
	"deleteOneSQL": deleteOneSQL, "deleteBatchSQL": deleteBatchSQL,
	"messageOneSQL": messageOneSQL, "messageBatchSQL": messageBatchSQL,
	"insertBatchSQL": insertBatchSQL, "insertBatchNotifySQL": insertBatchNotifySQL,
	"insertOneSQL": insertOneSQL, "insertOneLockSQL": insertOneLockSQL,
	"insertOneNotifySQL": insertOneNotifySQL, "insertOneLockNotifySQL": insertOneLockNotifySQL,
	"insertBinaryBatchSQL": insertBinaryBatchSQL, "insertBinaryBatchNotifySQL": insertBinaryBatchNotifySQL,
	"insertBinaryOneSQL": insertBinaryOneSQL, "insertBinaryOneLockSQL": insertBinaryOneLockSQL,
	"insertBinaryOneNotifySQL": insertBinaryOneNotifySQL, "insertBinaryOneLockNotifySQL": insertBinaryOneLockNotifySQL,
})

// idents are the quoted names of t's tables and indexes (t with defaults).
func idents(t Tables) sqltext.Idents {
	return sqltext.For(t.Schema, t.Outbox, t.Processed)
}
