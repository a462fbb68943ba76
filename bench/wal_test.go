package bench_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/bench"
	"github.com/pgoutbox/outbox/internal/tmppg"
)

// The wal scenario with --short on a throwaway wal_level=logical cluster:
// every row of its three tables reports a non-zero figure.
func TestShortWALScenarioReportsEveryRow(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, err := tmppg.Logical(ctx, 10, map[string]string{"max_connections": "150", "max_slot_wal_keep_size": "4GB"})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the wal scenario needs a throwaway cluster with wal_level=logical, and none started: %v", err)
		}
		t.Skipf("skipped: the wal scenario needs a throwaway cluster with wal_level=logical (initdb/pg_ctl), and none started: %v", err)
	}
	t.Cleanup(func() { _ = cluster.Stop() })

	cfg := shortConfig(t)
	cfg.WALDatabaseURL = cluster.URL()
	results, err := bench.Run(ctx, cfg, "wal")
	require.NoError(t, err)
	require.Len(t, results, 1)
	var out bytes.Buffer
	require.NoError(t, results[0].WriteText(&out))
	t.Log("\n" + out.String())

	m := results[0].Metrics
	for _, src := range []string{"poll", "wal"} {
		require.Positive(t, m["wal.drain."+src+".events_per_s"], "drain %s", src)
		require.GreaterOrEqual(t, m["wal.drain."+src+".published"], float64(5_000), "drain %s: records on the broker", src)
		require.Positive(t, m["wal.latency."+src+".events"], "latency %s", src)
		require.Positive(t, m["wal.latency."+src+".p50_ms"], "latency %s", src)
		require.Positive(t, m["wal.business."+src+".relayed"], "business %s: events relayed", src)
	}
	for _, run := range []string{"none", "emit", "poll", "wal"} {
		require.Positive(t, m["wal.business."+run+".tx_per_s"], "business %s", run)
	}
	require.Len(t, results[0].Tables, 3)
	for _, tb := range results[0].Tables {
		require.NotEmpty(t, tb.Rows, tb.Title)
	}
}
