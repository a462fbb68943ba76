package cli_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The --mode wal flags' values that cannot work are refused with what to
// use instead, before anything connects (no server answers here).
func TestWALRelayFlagsAreCheckedFirst(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--linger", "-3ms"}, "--linger -3ms: use a duration such as 2ms, or 0 to turn it off"},
		{[]string{"--linger", "2s"}, "--linger 2s: use at most 1s (a few milliseconds take in many transactions per read), or 0 to turn it off"},
		{[]string{"--heartbeat-interval", "0"}, "--heartbeat-interval 0: use a positive duration, or a negative one to turn heartbeats off"},
		{[]string{"--max-slot-lag-bytes", "0"}, "--max-slot-lag-bytes 0: use a positive number of bytes"},
	}
	for _, tc := range cases {
		args := append([]string{"relay", "--mode", "wal", "--database-url", "postgres://nobody@127.0.0.1:1/x", "--brokers", "127.0.0.1:1"}, tc.args...)
		code, _, stderr := outbox(t, args...)
		require.Equal(t, 1, code, "%v", tc.args)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
}
