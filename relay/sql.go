package relay

import (
	"strings"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/sqltext"
)

// claimSQL claims and marks one batch in a single statement; the caller
// resets the rows the broker did not acknowledge before it commits, so
// nothing is dispatched that was not acknowledged. Parameters: $1 batch
// size, $2 the rows this relayer is publishing in its previous batch, still
// open (pipelining): they come first, so they are not gaps, $3 the batch's
// budget in bytes (Config.MaxBatchBytes).
//
//   - held: the aggregates whose pending head row is held after a permanent
//     failure (holdSQL), read from the failures table, a handful of rows in
//     a healthy system, so every relayer skips them, not only the one that
//     saw the failure. A hold on a row that is no longer pending (parked,
//     deleted, or published by a retry) holds nothing.
//   - candidates: the first $1 pending rows in id order that no other relayer
//     has locked, served by the pending index (id) WHERE dispatched_at IS
//     NULL; its cost does not depend on how many dispatched rows remain.
//   - seen: the pending rows from the first one up to the last candidate, as
//     this statement's snapshot sees them, locked or not: a second walk over
//     the stretch of the pending index the candidates scan covered, without
//     locking. Bounded on both sides, so it reads no dispatched row whichever
//     index the planner picks, even on statistics taken before a backlog
//     drained (TestClaimPlanUsesPendingIndex); capped at 4 batches when
//     other relayers hold many rows in front.
//   - gaps: per aggregate, the first seen row that is not a candidate (a row
//     another relayer holds) or the first candidate beyond the cap. Candidates
//     and seen rows are matched by grouping their union on id, which needs
//     no join the planner could turn into a loop. Candidates are seen rows,
//     so when both counts agree there is no gap and the grouping is skipped
//     (a one-time filter): the common case of a single relayer. (The one
//     exception: a row of $3 that the previous batch returned to pending and
//     committed before this scan can be a candidate that seen leaves out;
//     but then the previous batch failed, and this one is rolled back
//     unpublished.)
//   - cutoff: the last candidate within the budget $3, counted in id order
//     by the bytes the relayer will hold: payload and headers as text (what
//     RETURNING sends; pgx's binary jsonb is the same text behind a version
//     byte) and type. Never by pg_column_size: TOAST compresses, and
//     megabytes of repetitive JSON store in kilobytes. The first candidate
//     always fits; candidates past the cutoff wait for the next claim, in order.
//     Printing a row to measure it costs about what it prints, so
//     candidates does it only for rows stored uncompressed in at most $3 /
//     $1 bytes: they print in about what they store, a batch of them in
//     about the budget (a compressed value can print a hundredfold). The
//     others are sized by a lookup in id order that stops at the first row
//     past the budget (TestClaimSizesRowsAsSentUpToTheBudget). When every
//     candidate was sized as it was locked and together they fit, the
//     running sum (a sort) is skipped.
//   - accepted: the candidates up to the cutoff and before their
//     aggregate's gap. They are the
//     oldest pending rows of their aggregate with nothing missing in between,
//     so publishing them cannot overtake an earlier event held by another
//     relayer. A hot aggregate's rows are all accepted: it drains in full
//     batches. No pending row of an aggregate can hide beyond the last
//     candidate with a smaller id than one of that aggregate's candidates:
//     producers take a per-aggregate lock before drawing ids and hold it to
//     commit, so an aggregate's rows commit in id order.
//
// Rows another relayer committed after this statement's snapshot still look
// pending to seen; that only makes the claim more conservative. The ids come
// out of the candidates' lock, so ANY(ARRAY(...)) keeps the update on the
// primary key. The update's range (min and max of the accepted ids) says
// nothing new to a plain table, but on a partitioned one (the partitioned
// layout) it lets the executor skip every partition outside it: without
// it each partition's primary key is probed for every accepted id, which
// made a claim of 1,000 rows over 30 partitions twice as slow. The final LEFT JOIN always yields a row carrying how many
// rows were locked, even when none was accepted (the row's other columns
// are then NULL), so telling "nothing pending" from "everything waits
// behind another relayer" costs no second statement. No statement reads an
// (aggregate_id, id) index: migration 3 dropped it, with the earlier shape
// of the claim, one descent per aggregate.
const claimSQL = `WITH held AS MATERIALIZED (
  SELECT coalesce(array_agg(DISTINCT f.aggregate_id), '{}') AS aggs FROM {{failures}} f
  WHERE f.held_until > now()
    AND EXISTS (SELECT 1 FROM {{outbox}} o WHERE o.id = f.event_id AND o.dispatched_at IS NULL)
), candidates AS MATERIALIZED (
  SELECT id, aggregate_id,
    CASE WHEN pg_column_size(payload) + coalesce(pg_column_size(headers), 0) <= $3::bigint / $1::integer
      AND pg_column_compression(payload) IS NULL AND pg_column_compression(headers) IS NULL
      THEN octet_length(payload::text) + coalesce(octet_length(headers::text), 0) + octet_length(type) END AS size
  FROM {{outbox}}
  WHERE dispatched_at IS NULL AND NOT (aggregate_id = ANY((SELECT aggs FROM held)::uuid[]))
  ORDER BY id
  LIMIT $1
  FOR UPDATE SKIP LOCKED
), seen AS MATERIALIZED (
  SELECT id, aggregate_id FROM {{outbox}}
  WHERE dispatched_at IS NULL AND NOT (aggregate_id = ANY((SELECT aggs FROM held)::uuid[]))
    AND NOT (id = ANY($2::bigint[]))
    AND id >= (
      SELECT id FROM {{outbox}}
      WHERE dispatched_at IS NULL AND NOT (aggregate_id = ANY((SELECT aggs FROM held)::uuid[]))
      ORDER BY id LIMIT 1)
    AND id <= (SELECT max(id) FROM candidates)
  ORDER BY id
  LIMIT 4 * $1
), gaps AS (
  SELECT aggregate_id, min(id) AS gap FROM (
    SELECT id, aggregate_id FROM (
      SELECT id, aggregate_id FROM candidates UNION ALL SELECT id, aggregate_id FROM seen
    ) u GROUP BY id, aggregate_id HAVING count(*) = 1
  ) lone
  WHERE (SELECT count(*) FROM seen) <> (SELECT count(*) FROM candidates)
  GROUP BY aggregate_id
), cutoff AS (
  SELECT CASE WHEN count(size) = count(*) AND coalesce(sum(size), 0) <= $3 THEN max(id) ELSE coalesce((
    SELECT coalesce(prev, id) FROM (
      SELECT id, lag(id) OVER w AS prev, sum(coalesce(size, (
        SELECT octet_length(o.payload::text) + coalesce(octet_length(o.headers::text), 0) + octet_length(o.type)
        FROM {{outbox}} o WHERE o.id = c.id))) OVER w AS upto
      FROM candidates c WINDOW w AS (ORDER BY id)
    ) s WHERE upto > $3 ORDER BY id LIMIT 1
  ), max(id)) END AS id
  FROM candidates
), accepted AS (
  SELECT c.id FROM candidates c LEFT JOIN gaps g USING (aggregate_id)
  WHERE (g.gap IS NULL OR c.id < g.gap) AND c.id <= (SELECT id FROM cutoff)
), marked AS (
  UPDATE {{outbox}} SET dispatched_at = now()
  WHERE id = ANY(ARRAY(SELECT id FROM accepted))
    AND id >= (SELECT min(id) FROM accepted) AND id <= (SELECT max(id) FROM accepted)
  RETURNING id, aggregate_id, type, payload, headers, coalesce(requeued_at, created_at) AS created_at
)
SELECT m.id, m.aggregate_id, m.type, m.payload, m.headers, m.created_at, c.locked
FROM (SELECT count(*) AS locked FROM candidates) c LEFT JOIN marked m ON true`

// claimBinarySQL is claimSQL for an outbox with binary payloads on
// (migrate.Migrator.EnableBinaryPayloads): a row's payload is its JSONB
// or its payload_bytes, sized as the relayer holds it (the raw bytes), and
// the claim also returns payload_bytes and content_type. It is derived
// from claimSQL by binaryClaim, so that the two cannot drift apart.
var claimBinarySQL = binaryClaim(claimSQL)

// binaryClaim rewrites claimSQL's reads of payload into reads of payload
// or payload_bytes. Each fragment must be found (TestBinaryClaimRewrite).
func binaryClaim(sql string) string {
	for _, r := range binaryClaimRewrites {
		sql = strings.ReplaceAll(sql, r[0], r[1])
	}
	return sql
}

var binaryClaimRewrites = [][2]string{
	{"pg_column_size(payload)", "coalesce(pg_column_size(payload), pg_column_size(payload_bytes))"},
	{"pg_column_compression(payload) IS NULL", "pg_column_compression(payload) IS NULL AND pg_column_compression(payload_bytes) IS NULL"},
	{"octet_length(payload::text)", "coalesce(octet_length(payload::text), octet_length(payload_bytes))"},
	{"octet_length(o.payload::text)", "coalesce(octet_length(o.payload::text), octet_length(o.payload_bytes))"},
	{"RETURNING id, aggregate_id, type, payload, headers,", "RETURNING id, aggregate_id, type, payload, headers, payload_bytes, content_type,"},
	{"m.created_at, c.locked", "m.created_at, c.locked, m.payload_bytes, m.content_type"},
}

// claimBegin opens the claim's transaction, in the same round trip as
// BEGIN, with the claim planned for each run (a custom plan, so $3 is a
// constant array, which Postgres probes through a hash table instead of
// scanning it for every seen row) and without sequential or bitmap scans of
// the outbox: every table access in the claim must walk an index in order
// and stop early. Without statistics on the table (never analyzed:
// autovacuum off, or not yet run on a fresh backlog) Postgres guesses 0.5%
// of rows pending, and its plan for LIMIT 5000 otherwise read every pending
// row through a bitmap scan and sorted them, far slower than walking
// the pending index (TestClaimPlanUsesPendingIndex, "no statistics").
//
// JIT is off: a plan that must scan a table sequentially all the same
// (the exactly-once claim reads its small lanes table so) carries the
// planner's disable cost, far above jit_above_cost, and Postgres then
// compiled the claim for about 400 ms on every run.
const claimBegin = "BEGIN; SET LOCAL plan_cache_mode = force_custom_plan; SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL jit = off"

// claimBeginStatements are claimBegin's statements, which the relayer
// sends in one pipeline with the claim.
var claimBeginStatements = strings.Split(claimBegin, "; ")

// A partitioned outbox (the partitioned layout, migrate.Migrator.
// EnablePartitioned) is claimed with a generic plan: planned once per
// connection, the partitions a run does not need are skipped at run
// time (the bounds of seen and marked). Planned for each run, as claimBegin
// has it, every reference to the outbox is planned over every partition:
// with 30 partitions a claim of 10 rows cost 3.6 ms, 1,000 rows 10.9 ms;
// with the generic plan, 1.1 ms and 8.6 ms (one partition: 0.7 and 7.8;
// docs/partitioning.md). The custom plan's reason to be,
// a $2 array probed through a hash, is kept by claimPartitioned's rewrite:
// a generic plan scans a parameter array for each row, so the claim asks
// for the hashed anti-join of NOT IN instead. The plan rules (only index
// walks) are claimBegin's, and TestPartitionedClaimPlan checks them under
// fresh, stale and missing statistics.
const claimBeginPartitioned = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL jit = off"

var claimBeginPartitionedStatements = strings.Split(claimBeginPartitioned, "; ")

// claimPartitionedSQL and claimBinaryPartitionedSQL are claimSQL and
// claimBinarySQL for a partitioned outbox.
var (
	claimPartitionedSQL       = partitionedClaim(claimSQL)
	claimBinaryPartitionedSQL = partitionedClaim(claimBinarySQL)
)

// partitionedClaim rewrites a claim for a partitioned outbox. Each
// fragment must be found (TestPartitionedClaimRewrite).
func partitionedClaim(sql string) string {
	for _, r := range partitionedClaimRewrites {
		sql = strings.ReplaceAll(sql, r[0], r[1])
	}
	return sql
}

var partitionedClaimRewrites = [][2]string{
	{"AND NOT (id = ANY($2::bigint[]))", "AND id NOT IN (SELECT unnest($2::bigint[]))"},
}

// unmarkSQL returns rows the broker did not acknowledge to pending, inside
// the claim's transaction (so, to other sessions, they never left it).
const unmarkSQL = `UPDATE {{outbox}} SET dispatched_at = NULL WHERE id = ANY($1::bigint[])`

// holdSQL records rows that failed for good in the failures table, in the
// batch's transaction: the first failure holds the row's aggregate for $6
// (HoldOut, in microseconds), each later one for twice as long as the last,
// up to $7 (MaxHoldOut), each with 10% jitter so that holds recorded
// together do not all expire together. A row whose hold is still active
// was just held by another relayer, whose claim this one's snapshot
// predated: it is left as recorded (the attempt is not counted twice) and
// not returned. The primary key (event_id) serves the upsert. Parameters:
// $1 ids, $2 aggregates, $3 types, $4 reasons, $5 errors.
const holdSQL = `INSERT INTO {{failures}} AS f (event_id, aggregate_id, type, reason, error, first_failed_at, failed_at, held_until)
SELECT id, agg, typ, reason, err, now(), now(), now() + $6::bigint * (0.9 + 0.2 * random()) * interval '1 microsecond'
FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::text[], $5::text[]) AS u(id, agg, typ, reason, err)
ON CONFLICT (event_id) DO UPDATE
  SET reason = EXCLUDED.reason, error = EXCLUDED.error, failed_at = EXCLUDED.failed_at, attempts = f.attempts + 1,
      held_until = now() + least($6::bigint * power(2, least(f.attempts, 30)), $7::bigint) * (0.9 + 0.2 * random()) * interval '1 microsecond'
  WHERE f.held_until IS NULL OR f.held_until <= now()
RETURNING event_id, attempts, held_until`

// pendingSQL tells an idle relayer whether any row is pending, before it
// opens a claim's transaction: one probe of the pending index (id) WHERE
// dispatched_at IS NULL, without a lock or a transaction of its own. A
// row that is held (holdSQL) counts: the claim decides whether it is
// still held.
const pendingSQL = `SELECT EXISTS (SELECT 1 FROM {{outbox}} WHERE dispatched_at IS NULL)`

var _ = sqltext.Register("relay", map[string]string{
	"claimSQL": claimSQL, "claimBinarySQL": claimBinarySQL, "claimBegin": claimBegin, "unmarkSQL": unmarkSQL, "holdSQL": holdSQL,
	"pendingSQL":          pendingSQL,
	"claimPartitionedSQL": claimPartitionedSQL, "claimBinaryPartitionedSQL": claimBinaryPartitionedSQL, "claimBeginPartitioned": claimBeginPartitioned,
})

// render fills a statement's placeholders ({{outbox}}, {{failures}}) with
// tables' quoted names; New renders each statement once.
func render(sql string, tables outbox.Tables) string {
	tables = tables.WithDefaults()
	return sqltext.Render(sql, sqltext.For(tables.Schema, tables.Outbox, tables.Processed))
}

// The exactly-once claim (Common.ExactlyOnce) is claimSQL (or a variant)
// whose held aggregates also take those of every other lane's open
// reservation ({{lanes}}, migration 8): their rows are marked dispatched
// but their broker transaction is in flight, so a later event of such an
// aggregate must wait until the reservation is settled, or it could reach
// the broker first, or stay there after the reservation went back to
// pending. $4 is the claiming lane, which has no open reservation of its
// own when it claims (one batch in flight per lane). The lanes table is a
// handful of rows, read whole.
var (
	claimLanesSQL                  = lanesClaim(claimSQL)
	claimBinaryLanesSQL            = lanesClaim(claimBinarySQL)
	claimPartitionedLanesSQL       = lanesClaim(claimPartitionedSQL)
	claimBinaryPartitionedLanesSQL = lanesClaim(claimBinaryPartitionedSQL)
)

// lanesClaim rewrites a claim for the exactly-once relayer. Each fragment
// must be found (TestLanesClaimRewrite).
func lanesClaim(sql string) string {
	for _, r := range lanesClaimRewrites {
		sql = strings.ReplaceAll(sql, r[0], r[1])
	}
	return sql
}

var lanesClaimRewrites = [][2]string{
	{"SELECT coalesce(array_agg(DISTINCT f.aggregate_id), '{}') AS aggs FROM {{failures}} f",
		"SELECT coalesce(array_agg(DISTINCT f.aggregate_id), '{}') || (\n    SELECT coalesce(array_agg(a), '{}') FROM {{lanes}} l, unnest(l.aggs) a WHERE l.lane <> $4::integer\n  ) AS aggs FROM {{failures}} f"},
}

// laneTimeoutSQL is what the exactly-once relayer adds to a claim's
// BEGIN: a relayer paused (SIGSTOP) or cut off inside its claim's
// transaction holds its lane's row and its claimed rows locked; the server
// ends that session once it has been idle in it for $1 (the lane's
// lease, in milliseconds), so the others can adopt the lane.
const laneTimeoutSQL = "SELECT set_config('idle_in_transaction_session_timeout', $1, true)"

// laneRenewSQL, first in each exactly-once claim's transaction (and alone
// on idle), checks that this relayer still holds its lane (the epoch it
// took it at), extends its lease by $3 microseconds and clears the lane's
// reservation, whose batch is settled by then. It locks the lane's row to
// the transaction's end, so no one adopts the lane meanwhile. No row: the
// lane was taken over; the relayer steps down. Served by the primary key.
const laneRenewSQL = `UPDATE {{lanes}} SET lease_until = now() + $3::bigint * interval '1 microsecond', ids = NULL, aggs = NULL
WHERE lane = $1 AND epoch = $2
RETURNING seq`

// laneReserveSQL records the batch just claimed as the lane's reservation,
// seq one up, in the claim's transaction. Served by the primary key.
const laneReserveSQL = `UPDATE {{lanes}} SET seq = seq + 1, ids = $3::bigint[], aggs = $4::uuid[]
WHERE lane = $1 AND epoch = $2
RETURNING seq`

// laneTakeSQL takes a lane for a relayer ($1 owner): its own lane $3 if
// it still holds it at epoch $4, else the lowest lane whose lease expired,
// with an epoch one up and a lease of $2 microseconds; a lane another
// session is taking is skipped. With $5 (adopting an orphan) only a lane
// left with a reservation is taken, never $3 (the adopter's own: its
// reservation is its own to settle). Reads the lanes table whole (a
// handful of rows).
const laneTakeSQL = `UPDATE {{lanes}} l SET epoch = l.epoch + 1, owner = $1, lease_until = now() + $2::bigint * interval '1 microsecond'
WHERE l.lane = (
  SELECT lane FROM {{lanes}}
  WHERE ((lane = $3 AND epoch = $4) OR lease_until < now()) AND (ids IS NOT NULL OR NOT $5::boolean) AND NOT ($5::boolean AND lane = $3)
  ORDER BY lane = $3 DESC, lane
  LIMIT 1
  FOR UPDATE SKIP LOCKED)
RETURNING l.lane, l.epoch`

// laneCreateSQL adds a lane after the highest one, for a relayer that
// found none free; two relayers adding at once collide on the primary key
// and the loser tries again.
const laneCreateSQL = `INSERT INTO {{lanes}} (lane, owner, epoch, lease_until)
SELECT coalesce(max(lane), 0) + 1, $1, 1, now() + $2::bigint * interval '1 microsecond' FROM {{lanes}}
ON CONFLICT (lane) DO NOTHING
RETURNING lane, epoch`

// laneLockSQL reads a lane's reservation for recovery, locking the row:
// the lane's holder at epoch $2 decides its fate. Served by the primary
// key.
const laneLockSQL = `SELECT seq, coalesce(ids, '{}') FROM {{lanes}} WHERE lane = $1 AND epoch = $2 FOR UPDATE`

// laneReleaseSQL ends a lane's lease at once, for the next relayer that
// needs a lane. Served by the primary key.
const laneReleaseSQL = `UPDATE {{lanes}} SET lease_until = now() WHERE lane = $1 AND epoch = $2`

// laneReturnSQL returns a reservation's rows that did not reach the
// broker to pending; served by the primary key.
const laneReturnSQL = `UPDATE {{outbox}} SET dispatched_at = NULL WHERE id = ANY($1::bigint[]) AND dispatched_at IS NOT NULL`

// laneOrphansSQL, run by relayers without exactly-once, clears the
// reservations of the lanes whose lease ran out (their exactly-once
// relayer died, or the outbox's relays were switched off exactly-once
// since), with the epoch one up so that a holder that comes back steps
// down, and returns each cleared lane and its reserved ids, for
// laneReturnSQL. A lane another session holds locked is left to it.
const laneOrphansSQL = `UPDATE {{lanes}} l SET epoch = l.epoch + 1, ids = NULL, aggs = NULL
FROM (SELECT lane, ids FROM {{lanes}} WHERE ids IS NOT NULL AND lease_until < now() FOR UPDATE SKIP LOCKED) o
WHERE l.lane = o.lane
RETURNING l.lane, o.ids`

// laneLiveSQL lists the lanes whose lease runs: the exactly-once relayers
// at work on the outbox, by owner.
const laneLiveSQL = `SELECT lane, owner FROM {{lanes}} WHERE lease_until >= now() ORDER BY lane`

var _ = sqltext.Register("relay", map[string]string{
	"laneOrphansSQL": laneOrphansSQL, "laneLiveSQL": laneLiveSQL,
	"claimLanesSQL": claimLanesSQL, "claimBinaryLanesSQL": claimBinaryLanesSQL,
	"claimPartitionedLanesSQL": claimPartitionedLanesSQL, "claimBinaryPartitionedLanesSQL": claimBinaryPartitionedLanesSQL,
	"laneTimeoutSQL": laneTimeoutSQL,
	"laneRenewSQL":   laneRenewSQL, "laneReserveSQL": laneReserveSQL, "laneTakeSQL": laneTakeSQL, "laneCreateSQL": laneCreateSQL,
	"laneLockSQL": laneLockSQL, "laneReleaseSQL": laneReleaseSQL, "laneReturnSQL": laneReturnSQL,
})
