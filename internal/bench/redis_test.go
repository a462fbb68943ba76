package bench_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/bench"
)

// The redis scenario runs at short sizes and measures every figure it
// reports. Timings are printed, never checked.
func TestRedisScenario(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed; .ci/run installs it")
		}
		t.Skip("redis-server is not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	results, err := bench.Run(ctx, shortConfig(t), "redis")
	require.NoError(t, err)
	require.Len(t, results, 1)
	m := results[0].Metrics
	for _, k := range []string{"redis.go_redis.events_per_s", "redis.relay.events_per_s", "redis.relay_null.events_per_s", "redis.latency.1000.p50_ms"} {
		require.Positive(t, m[k], k)
	}
}
