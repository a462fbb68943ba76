package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/bench"
)

// The webhook scenario drains every event through the relay and the
// baseline, and measures a latency for each event, at its short size
// (the run checks the endpoint accepted every event, signed).
func TestShortWebhookScenario(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	results, err := bench.Run(ctx, shortConfig(t), "webhook")
	require.NoError(t, err)
	require.Len(t, results, 1)
	m := results[0].Metrics
	require.Positive(t, m["webhook.relay_per_s"])
	require.Positive(t, m["webhook.baseline_per_s"])
	require.Positive(t, m["webhook.latency.1000.p99_ms"])
}
