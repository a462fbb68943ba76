package bench_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/bench"
	"github.com/pgoutbox/outbox/internal/tmppg"
)

// The wal scenario with --short on a throwaway wal_level=logical cluster:
// every row of its three tables reports a non-zero figure, pg_recvlogical
// included (it ships with the server binaries the cluster needs).
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
	for _, src := range []string{"poll", "wal", "recvlogical"} {
		for _, backlog := range []string{"", "small."} {
			require.Positive(t, m["wal.drain."+backlog+src+".events_per_s"], "drain %s%s", backlog, src)
		}
	}
	for _, src := range []string{"poll", "wal"} {
		for _, backlog := range []string{"", "small."} {
			require.GreaterOrEqual(t, m["wal.drain."+backlog+src+".published"], float64(5_000), "drain %s%s: records on the broker", backlog, src)
		}
		require.Positive(t, m["wal.latency."+src+".events"], "latency %s", src)
		require.Positive(t, m["wal.latency."+src+".p50_ms"], "latency %s", src)
		if src == "wal" {
			require.Positive(t, m["wal.latency.wal_no_linger.events"], "latency wal, linger off")
			require.Positive(t, m["wal.latency.wal_no_linger.p50_ms"], "latency wal, linger off")
		}
		// Published at all (within the window or while catching up: a
		// loaded machine may relay nothing within a --short window). The
		// "wal" row is ModeInsert's, "insert.wal", checked below.
		row := map[string]string{"poll": "poll", "wal": "insert.wal"}[src]
		require.Positive(t, m["wal.business."+row+".events_per_batch"], "business %s: events relayed", src)
	}
	runs := []string{"none", "emit", "poll", "wal"}
	for _, mode := range []string{"insert", "insert_delete", "message"} {
		runs = append(runs, mode+".none", mode+".recvlogical", mode+".wal")
		require.Positive(t, m["wal.business."+mode+".wal.events_per_batch"], "business %s: events relayed", mode)
		require.Positive(t, m["wal.business."+mode+".wal.vs_recvlogical"], "business %s: vs pg_recvlogical", mode)
		require.Positive(t, m["wal.business."+mode+".wal.wal_bytes_per_event_life"], "business %s: WAL per event", mode)
	}
	for _, run := range runs {
		require.Positive(t, m["wal.business."+run+".tx_per_s"], "business %s", run)
		if run != "wal" { // the stable key of insert.wal's row
			require.Positive(t, m["wal.business."+run+".wal_bytes_per_event"], "business %s: WAL per event", run)
		}
	}
	// The polling relay's UPDATEs and ModeInsertDelete's deletes leave dead
	// tuples; relaying from the WAL leaves none.
	require.Positive(t, m["wal.business.poll.dead_tuples"])
	require.Positive(t, m["wal.business.insert_delete.wal.dead_tuples"])
	require.Zero(t, m["wal.business.insert.wal.dead_tuples"])
	require.Zero(t, m["wal.business.message.wal.dead_tuples"])
	require.Positive(t, m["wal.business.poll.cleanup_wal_bytes_per_event"], "cleanup deleted the polled rows")
	require.Positive(t, m["wal.business.insert.wal.cleanup_wal_bytes_per_event"], "cleanup deleted the rows the slot confirmed")

	require.Len(t, results[0].Tables, 3)
	for _, tb := range results[0].Tables {
		require.NotEmpty(t, tb.Rows, tb.Title)
		for _, row := range tb.Rows {
			require.NotContains(t, row[1]+row[2], "not run", "%s: %v", tb.Title, row)
		}
	}
	var targets []string
	for _, tg := range results[0].Targets {
		targets = append(targets, tg.Name)
		require.NotContains(t, tg.Measured, "not measured", tg.Name)
	}
	require.Contains(t, targets, "business tx/s, WAL relay vs pg_recvlogical: message")
	require.Contains(t, targets, "WAL bytes per event: insert")
}

// WALParts runs only the parts named: the business part alone reports
// its rows and targets, and no drain or latency figure.
func TestWALScenarioRunsOnlyThePartsAskedFor(t *testing.T) {
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
	cfg.WALParts = []string{"business"}
	results, err := bench.Run(ctx, cfg, "wal")
	require.NoError(t, err)
	require.Len(t, results, 1)
	m := results[0].Metrics
	for k := range m {
		require.NotRegexp(t, `^wal\.(drain|latency)\.`, k)
	}
	require.Positive(t, m["wal.business.insert_delete.wal.tx_per_s"])
	var targets []string
	for _, tg := range results[0].Targets {
		targets = append(targets, tg.Name)
	}
	require.Contains(t, targets, "business tx/s, WAL relay vs pg_recvlogical: insert_delete")
	require.NotContains(t, targets, "wal latency @1,000/s")

	cfg.WALParts = []string{"business", "drains"}
	_, err = bench.Run(ctx, cfg, "wal")
	require.ErrorContains(t, err, `wal part "drains"; use drain, latency or business`)
}
