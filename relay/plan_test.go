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
// them), and the per-aggregate gap check must read about as many index
// entries as the claim has candidates, also for one hot aggregate. Each
// case EXPLAINs the claim in a transaction opened the way the relayer opens
// it (ClaimBegin: a plan per run, no sequential or bitmap scans), including
// on statistics that lie: taken while every row was pending, or never taken.
func TestClaimPlanUsesPendingIndex(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		dispatched, pending int
		aggregates, batch   int
		// stale: statistics taken while every row was still pending, as
		// after a backlog built up during an outage (the planner then sees
		// the primary key and the pending index as the same size).
		stale bool
		// noStats: the table was never analyzed (autovacuum off or not yet
		// run): Postgres guesses 0.5% of rows pending.
		noStats bool
		// lanes: the exactly-once claim, with another lane's reservation
		// open (on aggregates the backlog does not have).
		lanes bool
	}{
		{name: "spread", dispatched: 100_000, pending: 1_000, aggregates: 100, batch: 1_000},
		{name: "hot", dispatched: 100_000, pending: 1_000, aggregates: 1, batch: 1_000},
		{name: "stale statistics", dispatched: 100_000, pending: 1_000, aggregates: 100, batch: 1_000, stale: true},
		{name: "no statistics", pending: 200_000, aggregates: 1_000, batch: relay.DefaultBatchSize, noStats: true},
		{name: "lanes spread", dispatched: 100_000, pending: 1_000, aggregates: 100, batch: 1_000, lanes: true},
		{name: "lanes hot", dispatched: 100_000, pending: 1_000, aggregates: 1, batch: 1_000, lanes: true},
		{name: "lanes stale statistics", dispatched: 100_000, pending: 1_000, aggregates: 100, batch: 1_000, stale: true, lanes: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t, pgtest.Options{MaxConns: 2})
			tbl := db.Tables.OutboxIdent()
			// Dispatched rows first, so they sit in front of the pending ones
			// in id order, as in a table the relayer has been draining.
			_, err := db.Pool.Exec(ctx, `INSERT INTO `+tbl+` (aggregate_id, type, payload, dispatched_at)
				SELECT md5((g % 5000)::text)::uuid, 'order.placed', '{}', CASE WHEN NOT $2 THEN now() END FROM generate_series(1, $1) g`, tc.dispatched, tc.stale)
			require.NoError(t, err)
			_, err = db.Pool.Exec(ctx, `INSERT INTO `+tbl+` (aggregate_id, type, payload)
				SELECT md5((g % $2)::text)::uuid, 'order.placed', '{}' FROM generate_series(1, $1) g`, tc.pending, tc.aggregates)
			require.NoError(t, err)
			if !tc.noStats {
				_, err = db.Pool.Exec(ctx, `VACUUM ANALYZE `+tbl)
				require.NoError(t, err)
			}
			if tc.stale {
				_, err = db.Pool.Exec(ctx, `UPDATE `+tbl+` SET dispatched_at = now() WHERE id <= $1`, tc.dispatched)
				require.NoError(t, err)
			}
			want := min(tc.pending, tc.batch)

			conn, err := db.Pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			prepare, lane := "PREPARE claim_plan(int, bigint[], bigint) AS "+relay.ClaimSQL(db.Tables), ""
			if tc.lanes {
				_, err = db.Pool.Exec(ctx, `INSERT INTO `+relay.LanesIdent(db.Tables)+` (lane, owner, epoch, lease_until, seq, ids, aggs)
					VALUES (2, 'other', 1, now() + interval '1 hour', 1, '{1,2,3}', ARRAY[gen_random_uuid(), gen_random_uuid()])`)
				require.NoError(t, err)
				prepare, lane = "PREPARE claim_plan(int, bigint[], bigint, int) AS "+relay.ClaimLanesSQL(db.Tables), ", 1"
			}
			_, err = conn.Exec(ctx, prepare)
			require.NoError(t, err)
			defer conn.Exec(ctx, "DEALLOCATE claim_plan") //nolint:errcheck // the connection goes away with the pool

			var out []struct {
				Plan          planNode `json:"Plan"`
				ExecutionTime float64  `json:"Execution Time"`
			}
			// EXPLAIN ANALYZE runs the UPDATE: roll it back.
			func() {
				_, err := conn.Exec(ctx, relay.ClaimBegin)
				require.NoError(t, err)
				defer conn.Exec(ctx, "ROLLBACK") //nolint:errcheck // always rolled back
				var raw []byte
				require.NoError(t, conn.QueryRow(ctx, fmt.Sprintf("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim_plan(%d, '{}', %d%s)", tc.batch, relay.DefaultMaxBatchBytes, lane)).Scan(&raw))
				require.NoError(t, json.Unmarshal(raw, &out))
			}()
			require.Len(t, out, 1)
			root := out[0].Plan
			require.EqualValues(t, want, root.ActualRows, "the claim should take a full batch")

			var candidateScans []planNode
			var gapReads float64
			root.walk("", func(n planNode, within string) {
				if n.RowsRemoved*n.ActualLoops > float64(want) {
					t.Errorf("%s %s in %q removed %.0f rows by filter, more than the %d claimed: it reads dispatched rows or repeats work", n.NodeType, n.IndexName, within, n.RowsRemoved*n.ActualLoops, want)
				}
				if n.RelationName != db.Tables.Outbox {
					return
				}
				require.NotContains(t, []string{"Seq Scan", "Bitmap Heap Scan"}, n.NodeType, "%s of the outbox in %q: it reads every row", n.NodeType, within)
				switch {
				case within == "CTE candidates":
					candidateScans = append(candidateScans, n)
				case n.NodeType != "ModifyTable" && n.IndexName != db.Tables.Outbox+"_pkey": // not the update by id
					gapReads += (n.ActualRows + n.RowsRemoved) * n.ActualLoops
				}
			})
			require.Len(t, candidateScans, 1, "one scan in the candidates CTE")
			cand := candidateScans[0]
			require.Equal(t, "Index Scan", cand.NodeType, "candidates scan")
			require.Equal(t, db.Tables.Outbox+"_pending_idx", cand.IndexName, "candidates scan")
			require.LessOrEqual(t, cand.ActualRows, float64(want), "the candidates scan stops at the batch")
			// The order check reads the stretch of the pending index the
			// candidates covered, once: about a batch. (EXPLAIN rounds
			// per-loop averages: a little slack.)
			require.LessOrEqual(t, gapReads, float64(want+want/10+1), "the order check read %.0f index entries for a batch of %d", gapReads, want)
			t.Logf("%d dispatched + %d pending on %d aggregates, batch %d: execution %.1f ms, candidates scan %s on %s (%.0f rows, %.0f removed by filter), order check read %.0f entries, %.0f shared buffer hits",
				tc.dispatched, tc.pending, tc.aggregates, tc.batch, out[0].ExecutionTime, cand.NodeType, cand.IndexName, cand.ActualRows, cand.RowsRemoved, gapReads, float64(root.SharedHitBlocks))
		})
	}
}
