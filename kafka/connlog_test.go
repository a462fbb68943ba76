package kafka_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/testlog"
	"github.com/pgoutbox/outbox/kafka"
)

// A broker that cannot be reached is logged at its first failed connection,
// not when a produce or fetch gives up; while it stays away, the retries
// are not logged one by one; once reached again, that is logged too. The
// lines name the broker, never the SASL password.
func TestClientLogsAnUnreachableBroker(t *testing.T) {
	t.Parallel()
	addr := kafkatest.FreeAddr(t)

	var buf testlog.Buffer
	cfg := kafka.ClientConfig{Brokers: []string{addr}, DialTimeout: time.Second,
		SASLMechanism: "PLAIN", SASLUser: "relay", SASLPassword: "s3cret",
		Logger: slog.New(slog.NewTextHandler(&buf, nil))}
	opts, err := cfg.Options()
	require.NoError(t, err)
	cl, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)

	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		require.Error(t, cl.Ping(ctx))
		cancel()
	}
	out := buf.String()
	require.Contains(t, out, "cannot connect to Kafka broker; retrying")
	require.Contains(t, out, "broker="+addr)
	require.Contains(t, out, "connection refused")
	require.Equal(t, 1, strings.Count(out, "cannot connect"), "one line, not one per attempt:\n%s", out)

	b, err := devkafka.Start(devkafka.Config{Listen: addr, Opts: []kfake.Opt{
		kfake.EnableSASL(), kfake.Superuser("PLAIN", "relay", "s3cret"),
	}})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		return cl.Ping(ctx) == nil
	}, 10*time.Second, 50*time.Millisecond)
	require.Contains(t, buf.String(), "Kafka broker reachable again")
	require.NotContains(t, buf.String(), "s3cret")
}
