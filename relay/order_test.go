package relay_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/relay"
)

// Three relayers on one table while eight writers commit (and sometimes
// roll back) 20,000 events on 200 aggregates: read back from the broker,
// every committed event is there, nothing else is, each aggregate sits in
// one partition and its events never go backwards.
func TestConcurrentRelayersKeepPerAggregateOrder(t *testing.T) {
	t.Parallel()
	const events, aggregates, writers, relayers = 20_000, 200, 8, 3
	b := setup(t)
	start := time.Now()
	rs := make([]*relay.Relayer, relayers)
	var mu sync.Mutex
	perRelayer := make([][]int, relayers)
	for i := range rs {
		rs[i] = b.relayer(t, func(c *relay.Config) {
			c.BatchSize = 500
			c.OnBatch = func(res relay.BatchResult) {
				mu.Lock()
				perRelayer[i] = append(perRelayer[i], res.Claimed)
				mu.Unlock()
			}
		})
		run(t, rs[i])
	}
	committed := b.writeLoad(t, events, aggregates, writers, "order.placed")
	t.Logf("writers done in %s", time.Since(start))
	require.Len(t, committed, events)
	b.waitDrained(t, 60*time.Second)
	elapsed := time.Since(start)

	recs := b.consume(t, events, 60*time.Second, "order")
	dups := checkDelivered(t, committed, recs)
	t.Logf("%d events, %d aggregates, %d writers, %d relayers: drained in %s; %d records read back, %d duplicates",
		events, aggregates, writers, relayers, elapsed.Round(time.Millisecond), len(recs), dups)
	active := 0
	for i, r := range rs {
		s := r.Stats()
		mu.Lock()
		t.Logf("relayer %d: %d batches, %d dispatched, %d failed batches", i, s.Batches, s.Dispatched, s.FailedBatches)
		mu.Unlock()
		if s.Dispatched > 0 {
			active++
		}
	}
	require.GreaterOrEqual(t, active, 2, "the relayers did not run concurrently; the test proves nothing about replicas")
}
