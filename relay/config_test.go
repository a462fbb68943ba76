package relay_test

import (
	"context"
	"github.com/pgoutbox/outbox/internal/fakesink"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/relay"
)

type discardPublisher struct{ fakesink.Kafka }

func (discardPublisher) Publish(_ context.Context, msgs []relay.Message) []error {
	return make([]error, len(msgs))
}

// relay.New refuses a bad configuration of its own fields with an error
// that names the field and says what to do, and fills in documented
// defaults otherwise. The shared fields' errors are TestCommonValidate's.
func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	// pgxpool connects lazily: New never talks to the server.
	pool, err := pgxpool.New(context.Background(), pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	good := func() relay.Config {
		return relay.Config{Common: relay.Common{Pool: pool, Sink: discardPublisher{}}}
	}

	for _, tc := range []struct {
		name string
		mod  func(*relay.Config)
		want []string
	}{
		{"negative poll interval", func(c *relay.Config) { c.PollInterval = -time.Second }, []string{"PollInterval is -1s", "positive duration", "0 for the default"}},
		{"negative hold out", func(c *relay.Config) { c.HoldOut = -time.Minute }, []string{"HoldOut is -1m0s"}},
		{"negative max hold out", func(c *relay.Config) { c.MaxHoldOut = -time.Minute }, []string{"MaxHoldOut is -1m0s"}},
		{"max hold out below hold out", func(c *relay.Config) { c.HoldOut, c.MaxHoldOut = time.Hour, time.Minute }, []string{"MaxHoldOut (1m0s) is below HoldOut (1h0m0s)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good()
			tc.mod(&cfg)
			r, err := relay.New(cfg)
			require.Error(t, err)
			require.Nil(t, r)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}

	r, err := relay.New(good())
	require.NoError(t, err)
	cfg := r.Config()
	require.Equal(t, relay.DefaultBatchSize, cfg.BatchSize)
	require.Equal(t, relay.DefaultMaxBatchBytes, cfg.MaxBatchBytes)
	require.Equal(t, time.Second, cfg.PollInterval)
	require.Equal(t, 2*time.Millisecond, cfg.BusyPollInterval)
	require.False(t, cfg.DisablePipelining)
	require.Equal(t, time.Minute, cfg.HoldOut)
	require.Equal(t, 100*time.Millisecond, cfg.BackoffMin)
	require.Equal(t, 30*time.Second, cfg.BackoffMax)
	require.Equal(t, 30*time.Second, cfg.ShutdownTimeout)
	require.Equal(t, 30*time.Minute, cfg.MaxHoldOut)
	require.Equal(t, outbox.Tables{}.WithDefaults(), cfg.Tables)
	require.NotNil(t, cfg.Logger)
	require.Equal(t, otel.GetTracerProvider(), cfg.TracerProvider)
	require.Equal(t, propagation.TraceContext{}, cfg.Propagator)

	off := good()
	off.BusyPollInterval = -time.Second
	r, err = relay.New(off)
	require.NoError(t, err)
	require.Negative(t, r.Config().BusyPollInterval, "a negative BusyPollInterval turns busy polling off")
}
