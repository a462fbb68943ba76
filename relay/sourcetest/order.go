package sourcetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Order: three relayers on one outbox while eight writers commit (and
// sometimes roll back) 20,000 events on 200 aggregates. Read back from the
// broker, every committed event is there, nothing else is, each aggregate
// sits in one partition and its events never go backwards in commit
// order. Once the relayers stop, nothing is left to publish. Relayers that
// Share must have published side by side; of relayers that Lead, exactly
// one published.
func Order(t *testing.T, src Source) {
	const events, aggregates, writers, relayers = 20_000, 200, 8, 3
	e := open(t, src)
	start := time.Now()
	rs := e.start(t, relayers, RelayerConfig{BatchSize: 500})
	committed := e.writeLoad(t, events, aggregates, writers, "order.placed")
	t.Logf("writers done in %s", time.Since(start))
	require.Equal(t, events, len(committed), "committed events")

	recs := e.consume(t, events, 120*time.Second, "order")
	elapsed := time.Since(start)
	dups := e.checkDelivered(t, committed, recs)
	t.Logf("%s: %d events, %d aggregates, %d writers, %d relayers: read back within %s; %d records, %d duplicates",
		src.Name, events, aggregates, writers, relayers, elapsed.Round(time.Millisecond), len(recs), total(dups))
	stopAll(rs)
	require.Empty(t, src.Unacked(t, e.db), "%s: events left to publish after a graceful stop", src.Name)

	active := 0
	for i, r := range rs {
		s := r.Stats()
		t.Logf("relayer %d: %d published, %d failed batches", i, s.Published, s.FailedBatches)
		if s.Published > 0 {
			active++
		}
	}
	switch src.Replicas {
	case Share:
		require.GreaterOrEqual(t, active, 2, "the relayers did not run concurrently; the scenario proves nothing about replicas")
	case Lead:
		require.Equal(t, 1, active, "exactly one relayer leads and publishes; the others stand by")
	}
}
