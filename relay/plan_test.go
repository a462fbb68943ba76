package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/relay"
)

// planNode is the part of EXPLAIN (FORMAT JSON) output the plan tests read.
type planNode struct {
	NodeType        string     `json:"Node Type"`
	SubplanName     string     `json:"Subplan Name"`
	RelationName    string     `json:"Relation Name"`
	IndexName       string     `json:"Index Name"`
	ActualRows      float64    `json:"Actual Rows"`
	ActualLoops     float64    `json:"Actual Loops"`
	RowsRemoved     float64    `json:"Rows Removed by Filter"`
	SharedHitBlocks int64      `json:"Shared Hit Blocks"`
	Plans           []planNode `json:"Plans"`
}

// walk calls fn for every node with the name of the CTE or subplan it sits
// in ("" for the main query).
func (n planNode) walk(within string, fn func(n planNode, within string)) {
	if n.SubplanName != "" {
		within = n.SubplanName
	}
	fn(n, within)
	for _, c := range n.Plans {
		c.walk(within, fn)
	}
}

// The claim must cost the same however many dispatched rows the table holds
// (the seed's plan walked the primary key and filtered out every one of
// them), and the per-aggregate gap check must read at most as many index
// entries as the claim has candidates, also for one hot aggregate. Both are
// checked on the custom plan and on the generic plan a prepared statement
// switches to after five runs, which is what a long-running relayer executes.
func TestClaimPlanUsesPendingIndex(t *testing.T) {
	t.Parallel()
	const (
		dispatched = 100_000
		pending    = 1_000
		batch      = 1_000
	)
	for _, tc := range []struct {
		name       string
		aggregates int
		// stale: statistics taken while every row was still pending, as
		// after a backlog built up during an outage (the planner then sees
		// the primary key and the pending index as the same size).
		stale bool
	}{
		{"spread", 100, false},
		{"hot", 1, false},
		{"stale statistics", 100, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t, pgtest.Options{MaxConns: 2})
			tbl := db.Tables.OutboxIdent()
			// Dispatched rows first, so they sit in front of the pending ones
			// in id order, as in a table the relayer has been draining.
			_, err := db.Pool.Exec(ctx, `INSERT INTO `+tbl+` (aggregate_id, type, payload, dispatched_at)
				SELECT md5((g % 5000)::text)::uuid, 'order.placed', '{}', CASE WHEN NOT $2 THEN now() END FROM generate_series(1, $1) g`, dispatched, tc.stale)
			require.NoError(t, err)
			_, err = db.Pool.Exec(ctx, `INSERT INTO `+tbl+` (aggregate_id, type, payload)
				SELECT md5((g % $2)::text)::uuid, 'order.placed', '{}' FROM generate_series(1, $1) g`, pending, tc.aggregates)
			require.NoError(t, err)
			_, err = db.Pool.Exec(ctx, `VACUUM ANALYZE `+tbl)
			require.NoError(t, err)
			if tc.stale {
				_, err = db.Pool.Exec(ctx, `UPDATE `+tbl+` SET dispatched_at = now() WHERE id <= $1`, dispatched)
				require.NoError(t, err)
			}

			conn, err := db.Pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			_, err = conn.Exec(ctx, "PREPARE claim_plan(int, uuid[], bigint[], bigint) AS "+relay.ClaimSQL(db.Tables))
			require.NoError(t, err)
			defer conn.Exec(ctx, "DEALLOCATE claim_plan") //nolint:errcheck // the connection goes away with the pool

			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				var out []struct {
					Plan          planNode `json:"Plan"`
					ExecutionTime float64  `json:"Execution Time"`
				}
				// EXPLAIN ANALYZE runs the UPDATE: roll it back.
				func() {
					tx, err := conn.Begin(ctx)
					require.NoError(t, err)
					defer tx.Rollback(ctx) //nolint:errcheck // always rolled back
					_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode)
					require.NoError(t, err)
					var raw []byte
					require.NoError(t, tx.QueryRow(ctx, fmt.Sprintf("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim_plan(%d, '{}', '{}', 4194304)", batch)).Scan(&raw))
					require.NoError(t, json.Unmarshal(raw, &out))
				}()
				require.Len(t, out, 1)
				root := out[0].Plan
				require.EqualValues(t, pending, root.ActualRows, "%s: the claim should take every pending row", mode)

				var candidateScans []planNode
				var gapReads, hits float64
				root.walk("", func(n planNode, within string) {
					if n.RowsRemoved*n.ActualLoops > pending {
						t.Errorf("%s: %s %s in %q removed %.0f rows by filter, more than the %d pending rows: it reads dispatched rows or repeats work", mode, n.NodeType, n.IndexName, within, n.RowsRemoved*n.ActualLoops, pending)
					}
					if n.RelationName != db.Tables.Outbox {
						return
					}
					require.NotEqual(t, "Seq Scan", n.NodeType, "%s: sequential scan of the outbox in %q", mode, within)
					switch {
					case within == "CTE candidates":
						candidateScans = append(candidateScans, n)
					case n.NodeType != "ModifyTable" && n.IndexName != db.Tables.Outbox+"_pkey": // not the update by id
						gapReads += (n.ActualRows + n.RowsRemoved) * n.ActualLoops
					}
				})
				require.Len(t, candidateScans, 1, "%s: one scan in the candidates CTE", mode)
				cand := candidateScans[0]
				require.Equal(t, "Index Scan", cand.NodeType, "%s: candidates scan", mode)
				require.Equal(t, db.Tables.Outbox+"_pending_idx", cand.IndexName, "%s: candidates scan", mode)
				// Each aggregate's gap lookup reads at most as many pending
				// rows as it has candidates: a batch's lookups read at most a
				// batch. (EXPLAIN rounds per-loop averages: a little slack.)
				require.LessOrEqual(t, gapReads, float64(batch+batch/10), "%s: gap lookups read %.0f index entries for a batch of %d; the work per aggregate is not bounded", mode, gapReads, batch)
				hits = float64(root.SharedHitBlocks)
				t.Logf("%s: %d dispatched + %d pending on %d aggregates: execution %.1f ms, candidates scan %s on %s (%.0f rows, %.0f removed by filter), gap lookups read %.0f entries, %.0f shared buffer hits",
					mode, dispatched, pending, tc.aggregates, out[0].ExecutionTime, cand.NodeType, cand.IndexName, cand.ActualRows, cand.RowsRemoved, gapReads, hits)
			}
		})
	}
}
