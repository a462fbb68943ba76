package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/bench"
	"github.com/pgoutbox/outbox/internal/rabbittest"
)

// The amqp scenario in short mode drains through RabbitMQ and measures
// both publishers and the latency; timings are printed, never checked.
func TestShortAMQPScenario(t *testing.T) {
	t.Parallel()
	rabbittest.Dial(t, "amqp://guest:guest@127.0.0.1:5672/") // the scenario's default server: skips (fails in CI) without it
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	results, err := bench.Run(ctx, shortConfig(t), "amqp")
	require.NoError(t, err)
	require.Len(t, results, 1)
	m := results[0].Metrics
	for _, k := range []string{"amqp.relay.events_per_s", "amqp.client.events_per_s", "amqp.latency.1000.p50_ms", "amqp.client_latency.1000.p50_ms"} {
		require.Positive(t, m[k], k)
	}
}
