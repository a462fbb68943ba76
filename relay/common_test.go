package relay_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/sourcetest"
)

// Common's zero fields take the documented defaults; set fields stay.
func TestCommonWithDefaults(t *testing.T) {
	t.Parallel()
	d := relay.Common{}.WithDefaults()
	require.Equal(t, relay.DefaultBatchSize, d.BatchSize)
	require.Equal(t, relay.DefaultMaxBatchBytes, d.MaxBatchBytes)
	require.Equal(t, relay.DefaultBackoffMin, d.BackoffMin)
	require.Equal(t, relay.DefaultBackoffMax, d.BackoffMax)
	require.Equal(t, relay.DefaultShutdownTimeout, d.ShutdownTimeout)
	require.Equal(t, outbox.Tables{}.WithDefaults(), d.Tables)
	require.Equal(t, slog.Default(), d.Logger)
	require.Equal(t, otel.GetTracerProvider(), d.TracerProvider)
	require.Equal(t, propagation.TraceContext{}, d.Propagator)

	set := relay.Common{BatchSize: 7, MaxBatchBytes: 9, BackoffMin: time.Second, BackoffMax: time.Hour, ShutdownTimeout: time.Minute, TopicPrefix: "p."}
	require.Equal(t, set.BatchSize, set.WithDefaults().BatchSize)
	require.Equal(t, set.MaxBatchBytes, set.WithDefaults().MaxBatchBytes)
	require.Equal(t, set.BackoffMin, set.WithDefaults().BackoffMin)
	require.Equal(t, set.BackoffMax, set.WithDefaults().BackoffMax)
	require.Equal(t, set.ShutdownTimeout, set.WithDefaults().ShutdownTimeout)
	require.Equal(t, "p.", set.WithDefaults().TopicPrefix)
	// Negative values are Validate's to refuse, not WithDefaults' to hide.
	require.Equal(t, -time.Second, relay.Common{BackoffMin: -time.Second}.WithDefaults().BackoffMin)
}

// Common.Validate refuses each bad shared field with a message that names
// it and says what to do, and relay.New refuses it with that message.
func TestCommonValidate(t *testing.T) {
	t.Parallel()
	// pgxpool connects lazily: New never talks to the server.
	pool, err := pgxpool.New(context.Background(), pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	sourcetest.RefusesBadCommons(t, pool, discardPublisher{}, func(c relay.Common) error {
		_, err := relay.New(relay.Config{Common: c})
		return err
	})
}
