package cli_test

import (
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/internal/pgtest"
)

func TestVersionSaysModuleVersion(t *testing.T) {
	t.Parallel()
	code, out, stderr := outbox(t, "--version")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "outbox version ")
	// Tests run without VCS stamping: "(devel)"; a release build says vX.Y.Z.
	require.Regexp(t, regexp.MustCompile(`\(devel\)|v\d+\.\d+\.\d+`), out)
}

// A mistyped subcommand is an error at every level, with cobra's
// suggestion; a group named alone still prints its help.
func TestMistypedSubcommandIsAnError(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "upp"}, `unknown command "upp" for "outbox migrate" Did you mean this? up`},
		{[]string{"events", "shwo", "1"}, `unknown command "shwo" for "outbox events" Did you mean this? show`},
		{[]string{"evnts"}, `unknown command "evnts" for "outbox" Did you mean this? events`},
		{[]string{"migrate", "zzz"}, `unknown command "zzz" for "outbox migrate"`},
	}
	for _, tc := range cases {
		code, out, stderr := outbox(t, tc.args...)
		require.Equal(t, 1, code, "%v", tc.args)
		require.Empty(t, out, "no help on stdout for %v", tc.args)
		require.Equal(t, "outbox: "+tc.want+"\n", stderr)
	}
	for _, group := range []string{"migrate", "events"} {
		code, out, _ := outbox(t, group)
		require.Equal(t, 0, code)
		require.Contains(t, out, "Available Commands:")
	}
}

// A mistyped flag is an error that suggests the command's nearest flags
// (within two edits, or the ones the name starts), as a mistyped
// subcommand suggests the nearest command; a name near none gets none.
func TestMistypedFlagSuggestsTheNearest(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"cleanup", "--retenton", "7d"}, "unknown flag: --retenton; did you mean --retention? (see 'outbox cleanup --help')"},
		{[]string{"relay", "--brokrs", "x:9092"}, "unknown flag: --brokrs; did you mean --brokers? (see 'outbox relay --help')"},
		{[]string{"events", "replay", "--from", "1"}, "unknown flag: --from; did you mean --from-id? (see 'outbox events replay --help')"},
		{[]string{"stats", "--log-levl", "debug"}, "unknown flag: --log-levl; did you mean --log-level? (see 'outbox stats --help')"},
		{[]string{"watchdog", "--stuck=5m"}, "unknown flag: --stuck; did you mean --stuck-after? (see 'outbox watchdog --help')"},
		{[]string{"migrate", "up", "--bogus"}, "unknown flag: --bogus (see 'outbox migrate up --help')"},
	}
	for _, tc := range cases {
		code, out, stderr := outbox(t, tc.args...)
		require.Equal(t, 1, code, "%v", tc.args)
		require.Empty(t, out)
		require.Equal(t, "outbox: "+tc.want+"\n", stderr)
	}
}

func TestErrorHintsNameTheCommandOnce(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "outbox: unknown flag: --bogus (see 'outbox --help')"},
		{[]string{"migrate", "up", "--bogus"}, "outbox: unknown flag: --bogus (see 'outbox migrate up --help')"},
		{[]string{"events", "show", "--bogus", "1"}, "outbox: unknown flag: --bogus (see 'outbox events show --help')"},
		// The library's own "outbox: " prefix is not doubled.
		{[]string{"stats", "--table", "Bad-Name"}, `outbox: outbox table name "Bad-Name" is not a plain identifier`},
	}
	for _, tc := range cases {
		code, _, stderr := outbox(t, tc.args...)
		require.Equal(t, 1, code)
		require.True(t, strings.HasPrefix(stderr, tc.want), "%v: %q", tc.args, stderr)
		require.NotContains(t, stderr, "outbox: outbox:")
	}
}

func TestZeroCountsAndBadLogFlagsAreRefused(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"relay", "--brokers", "127.0.0.1:1", "--batch-size", "0"}, "--batch-size 0: use a positive number"},
		{[]string{"relay", "--brokers", "127.0.0.1:1", "--max-batch-bytes", "0"}, "--max-batch-bytes 0: use a positive number"},
		{[]string{"relay", "--brokers", "127.0.0.1:1", "--cleanup-batch-size", "0"}, "--cleanup-batch-size 0: use a positive number"},
		{[]string{"relay", "--brokers", "127.0.0.1:1", "--poll-interval", "0"}, "--poll-interval 0s: use a positive duration"},
		{[]string{"relay", "--brokers", "127.0.0.1:1", "--procs", "0"}, `--procs "0": use auto`},
		{[]string{"relay", "--brokers", "127.0.0.1:1", "--procs", "many"}, `--procs "many": use auto`},
		{[]string{"consume", "--brokers", "127.0.0.1:1", "--topics", "x", "--concurrency", "-1"}, "use a positive number, or 0 for the consumer's default"},
		{[]string{"dev-kafka", "--partitions", "0"}, "--partitions 0: use a positive number"},
		{[]string{"cleanup", "--retention", "0d"}, "--retention 0s: use a positive duration, e.g. 7d"},
		{[]string{"cleanup", "--retention", "7days"}, `invalid argument "7days" for "--retention" flag`},
		// Commands that never log check the logging flags too.
		{[]string{"dev-kafka", "--log-level", "loud"}, `--log-level "loud": use debug, info, warn or error`},
		{[]string{"migrate", "print", "--log-level", "loud"}, `--log-level "loud"`},
		{[]string{"stats", "--log-format", "xml"}, `--log-format "xml": use text or json`},
	}
	for _, tc := range cases {
		code, _, stderr := outbox(t, tc.args...)
		require.Equal(t, 1, code, "%v", tc.args)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
		require.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
	}
}

func TestDatabaseFlagsOnlyWhereUsed(t *testing.T) {
	t.Parallel()
	help := func(args ...string) string {
		code, out, stderr := outbox(t, append(args, "--help")...)
		require.Equal(t, 0, code, stderr)
		return out
	}
	for _, args := range [][]string{{"dev-kafka"}, {}, {"migrate"}} {
		out := help(args...)
		for _, f := range []string{"--database-url", "--schema", "--table", "--processed-table"} {
			require.NotContains(t, out, f, "outbox %v --help", args)
		}
	}
	out := help("migrate", "print")
	require.NotContains(t, out, "--database-url")
	require.Contains(t, out, "--schema")
	for _, args := range [][]string{{"migrate", "up"}, {"migrate", "status"}, {"relay"}, {"consume"}, {"stats"}, {"watchdog"}, {"cleanup"}, {"events", "show"}, {"events", "replay"}} {
		out := help(args...)
		for _, f := range []string{"--database-url", "--schema", "--table", "--processed-table"} {
			require.Contains(t, out, f, "outbox %v --help", args)
		}
	}
	for _, args := range [][]string{{"demo"}, {"bench"}} {
		out := help(args...)
		require.Contains(t, out, "--database-url")
		require.NotContains(t, out, "--schema", "%v makes schemas of its own", args)
	}
}

// cleanup takes its retentions in days, says them in days, and says which
// database it cleaned, without the password.
func TestCleanupTakesDaysAndLogsTheDatabase(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	const secret = "s3cret-pw-never-shown"
	u.User = url.UserPassword(u.User.Username(), secret) // trust auth ignores it; a password check would not
	code, out, stderr := outbox(t, "cleanup", "--database-url", u.String(), "--schema", db.Tables.Schema,
		"--retention", "7d", "--processed-retention", "1.5d", "--pause", "0")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "older than 7d")
	require.Contains(t, out, "older than 1d12h")
	require.Contains(t, stderr, "connected to Postgres")
	require.Contains(t, stderr, "host="+u.Hostname())
	require.Contains(t, stderr, "user="+u.User.Username())
	require.Equal(t, 1, strings.Count(stderr, "connected to Postgres"), "once: %s", stderr)
	require.NotContains(t, stderr+out, secret)
}

// dev-kafka --data keeps its data across a clean stop only (kfake writes
// its topic list at shutdown): the help says so, where --data is read.
func TestDevKafkaHelpSaysDataNeedsACleanStop(t *testing.T) {
	t.Parallel()
	code, help, stderr := outbox(t, "dev-kafka", "--help")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, help, "--data survives a clean stop only (Ctrl-C, SIGTERM)")
	require.Contains(t, help, "after kill -9, a crash or a power loss the\ndirectory is not usable")
	require.Regexp(t, `--data string\s+directory to persist topics and offsets in across clean stops \(not kill -9`, help)
}
