package bench_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/bench"
)

// The multi scenario in --short sizes: both relays run and every figure
// is there; the busy outbox's events are all found on the broker in each
// window (else a latency would be missing, with a note). Timings are
// printed, never checked.
func TestShortMultiScenarioMeasuresBothRelays(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	results, err := bench.Run(ctx, shortConfig(t), "multi")
	require.NoError(t, err)
	require.Len(t, results, 1)
	var out bytes.Buffer
	require.NoError(t, results[0].WriteText(&out))
	t.Log("\n" + out.String())
	m := results[0].Metrics
	for _, k := range []string{"alone", "multi"} {
		for _, f := range []string{"rss_mib", "peak_rss_mib", "server_connections", "p50_ms", "p99_ms"} {
			require.Positive(t, m["multi."+k+"."+f], "multi.%s.%s", k, f)
		}
		require.Contains(t, m, "multi."+k+".idle_cpu_pct")
	}
	require.Positive(t, m["multi.multi.p99_down_ms"])
	require.Len(t, results[0].Targets, 4)
}
