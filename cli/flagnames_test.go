package cli_test

import (
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/cli"
)

// eachFlag calls fn with every flag every command defines (its own and
// the persistent ones it passes down), deprecated aliases included.
func eachFlag(root *cobra.Command, fn func(c *cobra.Command, f *pflag.Flag)) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) { fn(c, f) })
		c.PersistentFlags().VisitAll(func(f *pflag.Flag) { fn(c, f) })
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// One name per meaning: rows per statement or transaction are
// --batch-size (--cleanup-batch-size for the relay's cleanup job),
// machine output is --json. The names used before live on only as
// deprecated aliases.
func TestFlagNamesFollowOneConvention(t *testing.T) {
	t.Parallel()
	forbidden := regexp.MustCompile(`^(batch|chunk|chunk-size|output|format|out|machine|cleanup-batch)$|(^|-)batch$|chunk`)
	// consume's --output is not yet a deprecated alias of --json; once it
	// is, this exception matches nothing.
	exceptions := map[string]bool{"outbox consume --output": true}
	n := 0
	eachFlag(cli.NewRoot(io.Discard, io.Discard), func(c *cobra.Command, f *pflag.Flag) {
		n++
		if f.Deprecated != "" {
			require.True(t, f.Hidden, "%s --%s is deprecated and must not show in --help", c.CommandPath(), f.Name)
			return
		}
		name := c.CommandPath() + " --" + f.Name
		if exceptions[name] {
			return
		}
		require.False(t, forbidden.MatchString(f.Name), "%s: use --batch-size / --cleanup-batch-size for rows per batch, --json for machine output", name)
		if strings.Contains(f.Usage, "JSON") && f.Name != "log-format" {
			require.Equal(t, "json", f.Name, "%s prints JSON: the flag is --json", name)
			require.Equal(t, "bool", f.Value.Type(), name)
		}
	})
	require.Greater(t, n, 100, "the walk saw every command's flags")
}

// An old name sets the same variable as the new one, says it is
// deprecated, and an error about its value names the flag as typed.
func TestDeprecatedFlagNamesStillWork(t *testing.T) {
	t.Parallel()
	cases := []struct {
		cmd      []string
		old, new string
	}{
		{[]string{"cleanup"}, "batch", "batch-size"},
		{[]string{"relay"}, "cleanup-batch", "cleanup-batch-size"},
		{[]string{"events", "replay"}, "chunk", "batch-size"},
	}
	for _, tc := range cases {
		root := cli.NewRoot(io.Discard, io.Discard)
		c, _, err := root.Find(tc.cmd)
		require.NoError(t, err)
		require.NoError(t, c.ParseFlags([]string{"--" + tc.old, "1234"}))
		require.Equal(t, "1234", c.Flags().Lookup(tc.new).Value.String(), "--%s sets --%s", tc.old, tc.new)
		old := c.Flags().Lookup(tc.old)
		require.Equal(t, "use --"+tc.new, old.Deprecated)
		require.Equal(t, c.Flags().Lookup(tc.new).DefValue, old.DefValue)

		code, out, _ := outbox(t, append(tc.cmd, "--help")...)
		require.Equal(t, 0, code)
		require.Contains(t, out, "--"+tc.new+" ")
		require.NotContains(t, out, "--"+tc.old+" ")
	}

	code, _, stderr := outbox(t, "relay", "--brokers", "127.0.0.1:1", "--cleanup-batch", "0")
	require.Equal(t, 1, code)
	require.Equal(t, "Flag --cleanup-batch has been deprecated, use --cleanup-batch-size\noutbox: --cleanup-batch 0: use a positive number\n", stderr)
	code, _, stderr = outbox(t, "events", "replay", "--from-id", "1", "--to-id", "2", "--chunk", "0")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "outbox: --chunk 0: use 1 to 1000000 rows per transaction")
	code, _, stderr = outbox(t, "events", "replay", "--from-id", "1", "--to-id", "2", "--batch-size", "0")
	require.Equal(t, 1, code)
	require.Equal(t, "outbox: --batch-size 0: use 1 to 1000000 rows per transaction\n", stderr)
}
