package relay_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
				c.OnBatch = func(res relay.BatchResult) {
					mu.Lock()
					sizes = append(sizes, res.Claimed)
					mu.Unlock()
				}
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
