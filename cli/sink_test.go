package cli

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// --sink names the sink by its URL: the kafka scheme publishes like
// --brokers does.
func TestRelaySinkURLPublishes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	b, err := devkafka.Start(devkafka.Config{})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	_, err = db.Pool.Exec(context.Background(), "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload) SELECT gen_random_uuid(), 'order.placed', '{}' FROM generate_series(1, 50)")
	require.NoError(t, err)

	relayUntilDispatched(t, db, "--sink", "kafka://"+b.Addr())
}

// A --sink the relay cannot use is refused before anything is dialed,
// saying what to write instead, and without the URL's password.
func TestRelaySinkURLMistakes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--sink", "localhost:4222"}, "unknown scheme \"localhost\"; use one of"},
		{[]string{"--sink", "nosuch://host"}, "unknown scheme \"nosuch\"; use one of"},
		{[]string{"--sink", "kafka://u:s3cret@127.0.0.1:1"}, "takes brokers only"},
		{[]string{"--sink", "kafka://127.0.0.1:1", "--tls"}, "--tls is a Kafka flag"},
		{[]string{"--sink", "kafka://127.0.0.1:1", "--brokers", "127.0.0.1:2"}, "--brokers is a Kafka flag"},
		{[]string{"--sink", "::not a url"}, "is not a URL"},
	} {
		code, _, stderr := runCLI(t, db, append([]string{"relay"}, c.args...)...)
		require.Equal(t, 1, code, "%v: %s", c.args, stderr)
		require.Contains(t, stderr, c.want, c.args)
		require.NotContains(t, stderr, "s3cret", "a password never reaches an error")
		require.NotContains(t, stderr, "cannot reach", "refused before dialing")
	}
}
