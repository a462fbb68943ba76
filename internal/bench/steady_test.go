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

// The steady scenario with --short: each reader, a process of its own,
// takes in every event at both rates; the relays' latencies pair every
// committed event with the produce request that carried it, and the
// server's side (backend CPU, pg_stat_statements) is read on the
// throwaway cluster, which preloads the extension.
func TestShortSteadyScenarioMeasuresEveryReader(t *testing.T) {
	t.Parallel()
	if !tmppg.Available() {
		if os.Getenv("CI") == "true" {
			t.Fatal("the steady scenario needs initdb and pg_ctl for its throwaway cluster")
		}
		t.Skip("skipped: the steady scenario needs initdb and pg_ctl for its throwaway cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	results, err := bench.Run(ctx, shortConfig(t), "steady")
	require.NoError(t, err)
	require.Len(t, results, 1)
	var out bytes.Buffer
	require.NoError(t, results[0].WriteText(&out))
	t.Log("\n" + out.String())
	require.Empty(t, results[0].Notes[:len(results[0].Notes)-2], "nothing the scenario could not measure")

	m := results[0].Metrics
	for _, rate := range []string{"1000", "10000"} {
		for _, src := range []string{"recvlogical", "floor", "poll", "wal"} {
			k := "steady." + rate + "." + src + "."
			require.Positive(t, m[k+"events"], k+"events")
			require.Positive(t, m[k+"achieved_per_s"], k+"achieved_per_s")
			require.Contains(t, m, k+"cpu_us_per_event")
			require.Contains(t, m, k+"statements_per_event", "pg_stat_statements read")
		}
		for _, src := range []string{"floor", "poll", "wal"} {
			k := "steady." + rate + "." + src + "."
			require.Contains(t, m, k+"p50_ms", "every committed event found on the broker")
			require.GreaterOrEqual(t, m[k+"p99_ms"], m[k+"p50_ms"])
			require.Positive(t, m[k+"events_per_request"])
			require.Contains(t, m, k+"vs_recvlogical")
		}
		// The polling relay claims with SQL; the WAL source runs none per event.
		require.Positive(t, m["steady."+rate+".poll.statements_per_event"])
	}
}

func TestSteadyConfigRefusesBadRatesAndSources(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  func(*bench.Config)
		want string
	}{
		{func(c *bench.Config) { c.SteadyRates = []int{0} }, "steady rate 0; use 1 to 100,000 events/s"},
		{func(c *bench.Config) { c.SteadyRates = []int{1000, 200_000} }, "steady rate 200000"},
		{func(c *bench.Config) { c.SteadySources = []string{"poll", "kafka"} }, `steady source "kafka"; use poll, wal, recvlogical or floor`},
	} {
		cfg := shortConfig(t)
		tc.cfg(&cfg)
		_, err := bench.Run(context.Background(), cfg, "steady")
		require.ErrorContains(t, err, tc.want)
	}
}
