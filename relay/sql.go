package relay

import "strings"

// claimSQL claims and marks one batch in a single statement; the caller
// resets the rows the broker did not acknowledge before it commits, so
// nothing is dispatched that was not acknowledged. Parameters: $1 batch
// size, $2 aggregates held out after a permanent failure.
//
//   - candidates: the first $1 pending rows in id order that no other relayer
//     has locked, served by the pending index (id) WHERE dispatched_at IS
//     NULL; its cost does not depend on how many dispatched rows remain.
//   - gaps: per aggregate, the first pending row (in id order, as this
//     statement sees it) that is not a candidate: a row another relayer has
//     locked, or one beyond the candidates. Served by the (aggregate_id, id)
//     WHERE dispatched_at IS NULL index, reading at most as many rows as the
//     aggregate has candidates: the work per aggregate is bounded.
//     MATERIALIZED, because gaps is referenced twice below and Postgres
//     would otherwise inline it into the join with candidates and run the
//     lookup once per candidate row (twice when a gap exists) instead of
//     once per aggregate: quadratic for a hot aggregate, 1M index entries
//     and 370 ms for a batch of 1,000 on one aggregate instead of 1,000
//     entries and 16 ms (TestClaimPlanUsesPendingIndex checks it).
//   - accepted: the candidates before their aggregate's gap. They are the
//     oldest pending rows of their aggregate with nothing missing in between,
//     so publishing them cannot overtake an earlier event held by another
//     relayer. A hot aggregate's rows are all accepted: it drains in full
//     batches.
//
// Rows another relayer committed after this statement's snapshot still look
// pending to gaps; that only makes the claim more conservative. The ids come
// out of the candidates' lock, so ANY(ARRAY(...)) keeps the update on the
// primary key. The final LEFT JOIN always yields a row carrying how many
// rows were locked, even when none was accepted (the row's other columns
// are then NULL), so telling "nothing pending" from "everything waits
// behind another relayer" costs no second statement.
const claimSQL = `WITH candidates AS MATERIALIZED (
  SELECT id, aggregate_id FROM {{table}}
  WHERE dispatched_at IS NULL AND NOT (aggregate_id = ANY($2::uuid[]))
  ORDER BY id
  LIMIT $1
  FOR UPDATE SKIP LOCKED
), heads AS (
  SELECT aggregate_id, count(*) AS n FROM candidates GROUP BY aggregate_id
), gaps AS MATERIALIZED (
  SELECT h.aggregate_id, (
    SELECT min(p.id) FROM (
      SELECT o.id FROM {{table}} o
      WHERE o.aggregate_id = h.aggregate_id AND o.dispatched_at IS NULL
      ORDER BY o.id
      LIMIT h.n
    ) p
    WHERE p.id NOT IN (SELECT id FROM candidates)
  ) AS gap
  FROM heads h
), accepted AS (
  SELECT c.id FROM candidates c JOIN gaps g USING (aggregate_id)
  WHERE g.gap IS NULL OR c.id < g.gap
), marked AS (
  UPDATE {{table}} SET dispatched_at = now()
  WHERE id = ANY(ARRAY(SELECT id FROM accepted))
  RETURNING id, aggregate_id, type, payload, headers, created_at
)
SELECT m.id, m.aggregate_id, m.type, m.payload, m.headers, m.created_at, c.locked
FROM (SELECT count(*) AS locked FROM candidates) c LEFT JOIN marked m ON true`

// unmarkSQL returns rows the broker did not acknowledge to pending, inside
// the claim's transaction (so, to other sessions, they never left it).
const unmarkSQL = `UPDATE {{table}} SET dispatched_at = NULL WHERE id = ANY($1::bigint[])`

func render(sql, table string) string {
	return strings.ReplaceAll(sql, "{{table}}", table)
}
