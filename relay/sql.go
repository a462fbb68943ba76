package relay

import "strings"

// claimSQL claims and marks one batch in a single statement; the caller
// resets the rows the broker did not acknowledge before it commits, so
// nothing is dispatched that was not acknowledged. Parameters: $1 batch
// size, $2 aggregates held out after a permanent failure, $3 the rows this
// relayer is publishing in its previous batch, still open (pipelining):
// they come first, so they are not gaps, $4 the batch's payload budget in
// bytes.
//
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
//   - cutoff: the last candidate within the payload budget (by stored size,
//     which for large payloads is after TOAST compression), counted in id
//     order; the first candidate always fits. Candidates past it wait for
//     the next claim, in order. The running sum (a sort) is only computed
//     when the candidates together exceed the budget.
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
// primary key. The final LEFT JOIN always yields a row carrying how many
// rows were locked, even when none was accepted (the row's other columns
// are then NULL), so telling "nothing pending" from "everything waits
// behind another relayer" costs no second statement.
//
// An earlier shape looked each candidate aggregate up in an (aggregate_id,
// id) index instead: one index descent per aggregate, 23 of a claim's 49 ms
// with 1,000 aggregates in a batch. This one drains 1.5x faster
// (BenchmarkClaim), and migration 3 dropped that index.
const claimSQL = `WITH candidates AS MATERIALIZED (
  SELECT id, aggregate_id, pg_column_size(payload) AS size FROM {{table}}
  WHERE dispatched_at IS NULL AND NOT (aggregate_id = ANY($2::uuid[]))
  ORDER BY id
  LIMIT $1
  FOR UPDATE SKIP LOCKED
), seen AS MATERIALIZED (
  SELECT id, aggregate_id FROM {{table}}
  WHERE dispatched_at IS NULL AND NOT (aggregate_id = ANY($2::uuid[]))
    AND NOT (id = ANY($3::bigint[]))
    AND id >= (
      SELECT id FROM {{table}}
      WHERE dispatched_at IS NULL AND NOT (aggregate_id = ANY($2::uuid[]))
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
  SELECT CASE WHEN sum(size) <= $4 THEN max(id) ELSE (
    SELECT coalesce(max(id) FILTER (WHERE upto <= $4), min(id))
    FROM (SELECT id, sum(size) OVER (ORDER BY id) AS upto FROM candidates) s
  ) END AS id
  FROM candidates
), accepted AS (
  SELECT c.id FROM candidates c LEFT JOIN gaps g USING (aggregate_id)
  WHERE (g.gap IS NULL OR c.id < g.gap) AND c.id <= (SELECT id FROM cutoff)
), marked AS (
  UPDATE {{table}} SET dispatched_at = now()
  WHERE id = ANY(ARRAY(SELECT id FROM accepted))
  RETURNING id, aggregate_id, type, payload, headers, created_at
)
SELECT m.id, m.aggregate_id, m.type, m.payload, m.headers, m.created_at, c.locked
FROM (SELECT count(*) AS locked FROM candidates) c LEFT JOIN marked m ON true`

// claimBegin opens the claim's transaction, in the same round trip as
// BEGIN, with the claim planned for each run (a custom plan, so $3 is a
// constant array, which Postgres probes through a hash table instead of
// scanning it for every seen row) and without sequential or bitmap scans of
// the outbox: every table access in the claim must walk an index in order
// and stop early. Without statistics on the table (never analyzed:
// autovacuum off, or not yet run on a fresh backlog) Postgres guesses 0.5%
// of rows pending, and its plan for LIMIT 5000 otherwise read every pending
// row through a bitmap scan and sorted them: 450 ms a claim on a
// million-row backlog, against 40 ms walking the pending index
// (TestClaimPlanUsesPendingIndex, "no statistics").
const claimBegin = "BEGIN; SET LOCAL plan_cache_mode = force_custom_plan; SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off"

// unmarkSQL returns rows the broker did not acknowledge to pending, inside
// the claim's transaction (so, to other sessions, they never left it).
const unmarkSQL = `UPDATE {{table}} SET dispatched_at = NULL WHERE id = ANY($1::bigint[])`

func render(sql, table string) string {
	return strings.ReplaceAll(sql, "{{table}}", table)
}
