package consumer_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
)

// WithDefaults fills every zero field that has a default with its named
// constant, leaves set fields alone, and leaves negative values for
// Validate to refuse.
func TestConfigWithDefaults(t *testing.T) {
	t.Parallel()
	got := consumer.Config{Name: "billing", Topics: []string{"order"}}.WithDefaults()
	require.Equal(t, "billing", got.Group)
	require.Equal(t, consumer.DefaultMaxAttempts, got.MaxAttempts)
	require.Equal(t, consumer.DefaultBatchSize, got.BatchSize)
	require.Equal(t, consumer.DefaultMaxPollRecords, got.MaxPollRecords)
	require.Equal(t, consumer.DefaultConcurrency, got.Concurrency)
	require.Equal(t, consumer.DefaultBackoffMin, got.BackoffMin)
	require.Equal(t, consumer.DefaultBackoffMax, got.BackoffMax)
	require.Equal(t, consumer.DefaultCommitInterval, got.CommitInterval)
	require.Equal(t, consumer.DefaultShutdownTimeout, got.ShutdownTimeout)
	require.Equal(t, "order"+consumer.DefaultDeadLetterSuffix, got.DeadLetterTopic("order"))
	require.NotNil(t, got.Logger)
	require.NotNil(t, got.TracerProvider)
	require.NotNil(t, got.Propagator)
	require.Equal(t, outbox.Tables{}.WithDefaults(), consumer.ProcessorConfig{}.WithDefaults().Tables)

	set := consumer.Config{Group: "g", MaxAttempts: 2, BatchSize: -3}.WithDefaults()
	require.Equal(t, "g", set.Group)
	require.Equal(t, 2, set.MaxAttempts)
	require.Equal(t, -3, set.BatchSize, "a negative value is Validate's to refuse, not a default's to hide")
	require.ErrorContains(t, set.Validate(), "no Topics")
	set.Topics, set.DefaultHandler = []string{"order"}, func(context.Context, pgx.Tx, consumer.Event) error { return nil }
	require.ErrorContains(t, set.Validate(), "BatchSize is -3; use 1 to 10000, or 0 for the default 100")
}
