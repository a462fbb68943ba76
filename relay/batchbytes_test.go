package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/relay"
)

// MaxBatchBytes bounds what one batch holds in memory: large payloads are
// claimed a few at a time, in order, and a single row larger than the
// budget still goes, alone.
func TestMaxBatchBytesBoundsBatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		budget    int
		mostInOne int
	}{
		{"two rows per batch", 450_000, 2},
		{"one row larger than the budget goes alone", 1_000, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const events = 24
			b := setup(t)
			// ~190 KB of hex per payload (pglz leaves it about as large):
			// two fit the first budget, three do not.
			_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO `+b.db.Tables.OutboxIdent()+` (aggregate_id, type, payload)
				SELECT md5($2 || (g % 4)::text)::uuid, 'order.placed',
				  jsonb_build_object('n', g, 'blob', (SELECT string_agg(md5(random()::text || g || i), '') FROM generate_series(1, 6000) i))
				FROM generate_series(1, $1) g ORDER BY g`, events, b.db.Tables.Schema)
			require.NoError(t, err)
			var stored int
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT max(pg_column_size(payload)) FROM "+b.db.Tables.OutboxIdent()).Scan(&stored))
			t.Logf("largest payload as stored: %d bytes", stored)

			var mu sync.Mutex
			var sizes []int
			r := b.relayer(t, func(c *relay.Config) {
				c.MaxBatchBytes = tc.budget
				c.Hooks = append(c.Hooks, onBatch(func(res relay.BatchResult) {
					mu.Lock()
					sizes = append(sizes, res.Claimed)
					mu.Unlock()
				}))
			})
			run(t, r)
			b.waitDrained(t, 30*time.Second)
			recs := b.consume(t, events, 30*time.Second, "order")
			require.Len(t, recs, events)
			checkOrder(t, recs)

			mu.Lock()
			defer mu.Unlock()
			require.NotEmpty(t, sizes)
			most := 0
			for _, n := range sizes {
				most = max(most, n)
			}
			require.LessOrEqual(t, most, tc.mostInOne, "batches claimed %v rows", sizes)
			require.GreaterOrEqual(t, len(sizes), events/tc.mostInOne)
		})
	}
}

// The claim sizes rows by the bytes it returns (payload and headers as
// text, and type), but prints a row for that only where it has to: rows
// stored small and uncompressed as it locks them (they print in about
// what they store), larger ones in id order up to the first that crosses
// the budget, so a backlog of large rows does not cost a batch's worth of
// decompressing and printing per claim.
func TestClaimSizesRowsAsSentUpToTheBudget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		payload string // SQL of each row's payload, from g
		// claimed is how many of the 50 rows one claim takes; lookedUp, how
		// many it sized by reading them again, not as it locked them.
		claimed, lookedUp int
	}{
		// ~1 MB of text that stores in ~12 kB: four fit the 4 MiB budget,
		// the fifth is the one that crosses it.
		{"large compressible rows", `jsonb_build_object('n', g, 'blob', repeat('abcdefghij', 100000))`, 4, 5},
		{"small rows", `jsonb_build_object('n', g, 'currency', 'EUR')`, 50, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t, pgtest.Options{MaxConns: 2})
			tbl := db.Tables.OutboxIdent()
			_, err := db.Pool.Exec(ctx, `INSERT INTO `+tbl+` (aggregate_id, type, payload, headers)
				SELECT md5(g::text)::uuid, 'order.placed', `+tc.payload+`, '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
				FROM generate_series(1, 50) g`)
			require.NoError(t, err)
			_, err = db.Pool.Exec(ctx, `VACUUM ANALYZE `+tbl)
			require.NoError(t, err)

			conn, err := db.Pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			_, err = conn.Exec(ctx, "PREPARE claim_plan(int, bigint[], bigint) AS "+relay.ClaimSQL(db.Tables))
			require.NoError(t, err)
			var out []struct {
				Plan planNode `json:"Plan"`
			}
			func() {
				_, err := conn.Exec(ctx, relay.ClaimBegin)
				require.NoError(t, err)
				defer conn.Exec(ctx, "ROLLBACK") //nolint:errcheck // always rolled back
				var raw []byte
				require.NoError(t, conn.QueryRow(ctx, fmt.Sprintf("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim_plan(%d, '{}', %d)", relay.DefaultBatchSize, relay.DefaultMaxBatchBytes)).Scan(&raw))
				require.NoError(t, json.Unmarshal(raw, &out))
			}()
			require.Len(t, out, 1)
			require.EqualValues(t, tc.claimed, out[0].Plan.ActualRows, "rows claimed")
			lookedUp := 0.0
			out[0].Plan.walk("", func(n planNode, within string) {
				if n.RelationName == db.Tables.Outbox && strings.HasPrefix(within, "SubPlan") {
					lookedUp += n.ActualRows * n.ActualLoops
				}
			})
			require.EqualValues(t, tc.lookedUp, lookedUp, "rows read again to be sized")
		})
	}
}
