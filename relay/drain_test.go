package relay_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
)

// A backlog drains in full batches, whether it sits on one hot aggregate
// (the plain "oldest row per aggregate" claim would take one row a batch)
// or is spread over many.
func TestBacklogDrainsInFullBatches(t *testing.T) {
	t.Parallel()
	const events, batch = 20_000, 1_000
	for _, tc := range []struct {
		name       string
		aggregates int
	}{
		{"one_aggregate", 1},
		{"2000_aggregates", 2_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.preload(t, events, tc.aggregates, "backlog.added")
			var mu sync.Mutex
			var claims []int
			r := b.relayer(t, func(c *relay.Config) {
				c.BatchSize = batch
				c.Hooks = append(c.Hooks, onBatch(func(res relay.BatchResult) {
					mu.Lock()
					claims = append(claims, res.Claimed)
					mu.Unlock()
				}))
			})
			start := time.Now()
			stop := run(t, r)
			b.waitDrained(t, 60*time.Second)
			elapsed := time.Since(start)
			stop()

			mu.Lock()
			defer mu.Unlock()
			t.Logf("%d events on %d aggregates drained in %s (%.0f events/s), %d claims: %v",
				events, tc.aggregates, elapsed.Round(time.Millisecond), float64(events)/elapsed.Seconds(), len(claims), claims)
			require.NotEmpty(t, claims)
			sum := 0
			for _, c := range claims {
				sum += c
			}
			require.Equal(t, events, sum, "claims should add up to the backlog, each row once")
			for i, c := range claims[:len(claims)-1] {
				require.Equal(t, batch, c, "claim %d of %d took %d rows, not a full batch: %v", i+1, len(claims), c, claims)
			}
			require.EqualValues(t, events, r.Stats().Dispatched)

			recs := b.consume(t, events, 30*time.Second, "backlog")
			require.Len(t, recs, events, "no duplicates in a clean run")
			checkOrder(t, recs)
			if tc.aggregates == 1 {
				ids := make([]int64, len(recs))
				for i, rec := range recs {
					ids[i] = rec.EventID
				}
				require.True(t, slices.IsSorted(ids), "one aggregate: the whole backlog in id order")
			}
		})
	}
}
