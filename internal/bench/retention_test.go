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

// The cleanup scenario with --short: each layout's cleanup removes
// exactly the two oldest days of the fill (the scenario itself checks
// that no older row is left and every pending row is), the batched DELETE
// by deleting them, the partitioned layout by dropping two partitions;
// their WAL, dead tuples and the business latencies around them are
// measured, and the claim on every layout.
func TestShortCleanupScenarioRemovesTwoDays(t *testing.T) {
	t.Parallel()
	if !tmppg.Available() {
		if os.Getenv("CI") == "true" {
			t.Fatal("the cleanup scenario needs initdb and pg_ctl for its throwaway cluster")
		}
		t.Skip("skipped: the cleanup scenario needs initdb and pg_ctl for its throwaway cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	results, err := bench.Run(ctx, shortConfig(t), "cleanup")
	require.NoError(t, err)
	require.Len(t, results, 1)
	var out bytes.Buffer
	require.NoError(t, results[0].WriteText(&out))
	t.Log("\n" + out.String())

	m := results[0].Metrics
	const removed = 2 * 20_000 / 9 // two of the 9 days of the 19,998 events --short fills
	k := "cleanup.delete."
	require.EqualValues(t, removed, m[k+"removed"])
	require.EqualValues(t, removed, m[k+"deleted"], "ops.Cleanup deleted the two days")
	require.EqualValues(t, removed, m[k+"dead_tuples"], "every deleted row is a dead tuple until VACUUM")
	require.Positive(t, m[k+"wal_bytes"], "the cleanup role's WAL read from pg_stat_statements")
	require.GreaterOrEqual(t, m[k+"server_wal_bytes"], m[k+"wal_bytes"])
	require.GreaterOrEqual(t, m[k+"business_during_samples"], 200.0)
	require.Positive(t, m[k+"business_during_p99_ms"])
	require.Positive(t, m[k+"business_p99_ms"])

	k = "cleanup.drop."
	require.EqualValues(t, removed, m[k+"removed"], "the same rows")
	require.EqualValues(t, 2, m[k+"partitions_dropped"], "a partition a day")
	require.Zero(t, m[k+"dead_tuples"], "a dropped partition leaves no dead tuple")
	require.Positive(t, m[k+"wal_bytes"], "the detach and drop write catalog WAL")
	require.Positive(t, m[k+"wal_vs_delete"])
	require.GreaterOrEqual(t, m[k+"business_during_samples"], 200.0)

	for _, l := range []string{"plain", "partitions_1", "partitions_30"} {
		require.Positive(t, m["cleanup.claim."+l+".p50_ms"], l)
		require.Positive(t, m["cleanup.claim."+l+".planning_ms"], l)
	}
	require.EqualValues(t, 1, m["cleanup.claim.partitions_1.ratio"], "the base of the ratios")
	var targets []string
	for _, tg := range results[0].Targets {
		targets = append(targets, tg.Name)
	}
	require.ElementsMatch(t, []string{"claim with 30 partitions", "retention by partition drop: WAL", "retention by partition drop: dead tuples",
		"business p99 during retention by partition drop"}, targets)
}
