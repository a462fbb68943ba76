package cli

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
)

func TestRelayRedisSinkMistakes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--sink", "redis://:s3cret@127.0.0.1:1/0"}, "holds a password; drop it from the URL and set OUTBOX_REDIS_PASSWORD"},
		{[]string{"--sink", "redis://127.0.0.1:1/0?maxlen=-5"}, `--sink: redispub: ?maxlen="-5": use a positive whole number`},
		{[]string{"--sink", "rediss://127.0.0.1:1/0?max_bytes=10"}, "MaxBytes is 10"},
		{[]string{"--sink", "redis://127.0.0.1:1/0?colour=blue"}, "colour"},
		{[]string{"--sink", "redis://127.0.0.1:1/0", "--brokers", "127.0.0.1:2"}, "--brokers is a Kafka flag"},
	} {
		code, _, stderr := runCLI(t, db, append([]string{"relay"}, c.args...)...)
		require.Equal(t, 1, code, "%v: %s", c.args, stderr)
		require.Contains(t, stderr, c.want, c.args)
		require.NotContains(t, stderr, "s3cret", "a password never reaches an error")
		require.NotContains(t, stderr, "cannot reach", "refused before dialing")
	}
	code, _, stderr := runCLI(t, db, "relay", "--sink", "redis://127.0.0.1:1/0")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "cannot reach redis at 127.0.0.1:1", "an unreachable server is named")
}
