package outbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"

	"github.com/pgoutbox/outbox"
)

func TestConfigWithDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	d := outbox.Config{}.WithDefaults()
	require.Equal(t, outbox.Tables{}.WithDefaults(), d.Tables)
	require.Equal(t, outbox.DefaultMaxRecordBytes, d.MaxRecordBytes)
	require.Equal(t, outbox.KafkaRouting{MaxRecordBytes: outbox.DefaultMaxRecordBytes}, d.Routing)
	require.Equal(t, outbox.DefaultLockBuckets, d.LockBuckets)
	require.Equal(t, outbox.DefaultNotifyInterval, d.NotifyInterval)
	require.Equal(t, propagation.TraceContext{}, d.Propagator)
	require.NoError(t, d.Validate())
	require.Equal(t, d, d.WithDefaults(), "WithDefaults is idempotent")
	require.Negative(t, outbox.Config{NotifyInterval: -1}.WithDefaults().NotifyInterval, "negative NotifyInterval is kept: notify on every Emit")
	withRouting := outbox.Config{Routing: outbox.KafkaRouting{TopicPrefix: "a."}}.WithDefaults()
	require.Zero(t, withRouting.MaxRecordBytes, "MaxRecordBytes configures the default routing only")
	require.NoError(t, withRouting.Validate())

	for _, tc := range []struct {
		name string
		cfg  outbox.Config
		want string
	}{
		{"tables", outbox.Config{Tables: outbox.Tables{Outbox: "Events; DROP"}}, "not a plain identifier"},
		{"routing and prefix", outbox.Config{Routing: outbox.KafkaRouting{}, TopicPrefix: "a."}, "Config.Routing is set (outbox.KafkaRouting), and so are TopicPrefix or MaxRecordBytes"},
		{"routing and max", outbox.Config{Routing: outbox.KafkaRouting{}, MaxRecordBytes: 2 << 20}, "Config.Routing is set"},
		{"routing invalid", outbox.Config{Routing: outbox.KafkaRouting{TopicPrefix: "bad prefix"}}, "outbox: Config.Routing: "},
		{"prefix", outbox.Config{TopicPrefix: "bad prefix"}, "TopicPrefix"},
		{"max negative", outbox.Config{MaxRecordBytes: -1}, "MaxRecordBytes is -1"},
		{"max small", outbox.Config{MaxRecordBytes: 100}, "the smallest event makes a record of"},
		{"lock buckets", outbox.Config{LockBuckets: -1}, "outbox: LockBuckets is -1; use a positive number, or 0 for the default"},
		{"mode", outbox.Config{Mode: outbox.Mode(7)}, "outbox: Mode is 7; use ModeInsert, ModeInsertDelete or ModeMessage"},
	} {
		require.ErrorContains(t, tc.cfg.Validate(), tc.want, tc.name)
		require.ErrorContains(t, tc.cfg.WithDefaults().Validate(), tc.want, tc.name+" (defaults applied)")
		_, err := outbox.NewProducer(tc.cfg)
		require.ErrorContains(t, err, tc.want, tc.name+" (NewProducer)")
	}
}
