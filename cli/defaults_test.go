package cli_test

import (
	"context"
	"fmt"
	"github.com/pgoutbox/outbox/internal/fakesink"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/cli"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/ops"
	"github.com/pgoutbox/outbox/ops/monitor"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

type nopPublisher struct{ fakesink.Kafka }

func (nopPublisher) Publish(_ context.Context, msgs []relay.Message) []error {
	return make([]error, len(msgs))
}

// A flag left at its default does what the library does with the field
// left at zero: the flags take their defaults from the library's
// constants, and the library applies the same constants.
func TestFlagDefaultsAreTheLibrarys(t *testing.T) {
	t.Parallel()
	// The pool is never used: New only keeps it.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/x")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r, err := relay.New(relay.Config{Common: relay.Common{Pool: pool, Sink: nopPublisher{}}})
	require.NoError(t, err)
	applied := r.Config()

	root := cli.NewRoot(io.Discard, io.Discard)
	cases := []struct {
		cmd, flag string
		want      any
	}{
		{"relay", "batch-size", applied.BatchSize},
		{"relay", "max-batch-bytes", applied.MaxBatchBytes},
		{"relay", "poll-interval", applied.PollInterval},
		{"relay", "busy-poll-interval", applied.BusyPollInterval},
		{"relay", "hold-out", applied.HoldOut},
		{"relay", "max-hold-out", applied.MaxHoldOut},
		{"relay", "shutdown-timeout", applied.ShutdownTimeout},
		{"relay", "delivery-timeout", kafka.DefaultDeliveryTimeout},
		{"relay", "metrics-refresh", monitor.DefaultRefreshInterval},
		{"relay", "stuck-after", ops.DefaultStuckAfter},
		{"relay", "max-lag", ops.DefaultMaxLag},
		{"relay", "watchdog-interval", monitor.DefaultWatchdogInterval},
		{"relay", "cleanup-interval", monitor.DefaultCleanupInterval},
		{"relay", "retention", ops.DefaultRetention},
		{"relay", "processed-retention", ops.DefaultProcessedRetention},
		{"relay", "cleanup-batch-size", ops.DefaultCleanupBatch},
		{"relay", "cleanup-pause", ops.DefaultCleanupPause},
		{"relay", "linger", walrelay.DefaultLinger},
		{"relay", "heartbeat-interval", walrelay.DefaultHeartbeatInterval},
		{"relay", "leader-poll-interval", walrelay.DefaultLeaderPollInterval},
		{"relay", "unknown-topic-grace", walrelay.DefaultUnknownTopicGrace},
		{"cleanup", "retention", ops.DefaultRetention},
		{"cleanup", "processed-retention", ops.DefaultProcessedRetention},
		{"cleanup", "batch-size", ops.DefaultCleanupBatch},
		{"cleanup", "pause", ops.DefaultCleanupPause},
		{"watchdog", "stuck-after", ops.DefaultStuckAfter},
		{"watchdog", "max-lag", ops.DefaultMaxLag},
		{"watchdog", "limit", ops.DefaultStuckLimit},
		{"stats", "stuck-after", ops.DefaultStuckAfter},
		{"events replay", "batch-size", ops.DefaultReplayChunk},
	}
	for _, tc := range cases {
		cmd, _, err := root.Find(strings.Fields(tc.cmd))
		require.NoError(t, err)
		f := cmd.Flags().Lookup(tc.flag)
		require.NotNil(t, f, "%s --%s", tc.cmd, tc.flag)
		if want, ok := tc.want.(time.Duration); ok {
			// Duration flags print days ("7d"); compare the values.
			d, ok := f.Value.(interface{ Duration() time.Duration })
			require.True(t, ok, "%s --%s takes days", tc.cmd, tc.flag)
			require.Equal(t, want, d.Duration(), "%s --%s", tc.cmd, tc.flag)
			continue
		}
		require.Equal(t, fmt.Sprint(tc.want), f.DefValue, "%s --%s", tc.cmd, tc.flag)
	}
}
