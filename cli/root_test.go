package cli_test

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/cli"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// outbox runs the CLI in-process and returns exit code, stdout, stderr.
func outbox(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := cli.Main(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestHelpListsCommands(t *testing.T) {
	t.Parallel()
	code, out, _ := outbox(t, "--help")
	require.Equal(t, 0, code)
	for _, c := range []string{"migrate", "relay", "consume", "dev-kafka", "stats", "demo", "events", "watchdog", "cleanup", "bench"} {
		require.Contains(t, out, c)
	}
	code, out, _ = outbox(t, "relay", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "--brokers")
	require.Contains(t, out, "KAFKA_BROKERS")
	require.Contains(t, out, "--poll-only")
}

func TestBadInputGivesOneLineErrorAndNonZeroExit(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"relay", "--bogus"}, "unknown flag: --bogus (see 'outbox relay --help')"},
		{"unknown command", []string{"relya"}, "unknown command"},
		{"no brokers", []string{"relay", "--brokers", ""}, "no Kafka brokers: pass --brokers"},
		{"broker without port", []string{"relay", "--brokers", "localhost"}, "has no port"},
		{"bad table", []string{"stats", "--table", "Bad-Name"}, "not a plain identifier"},
		{"unreachable database", []string{"migrate", "up", "--database-url", "postgres://u@127.0.0.1:1/x?connect_timeout=2"}, "cannot reach Postgres at 127.0.0.1:1/x as u"},
		{"bad database url", []string{"stats", "--database-url", "postgres://u:pw@[::1"}, "bad database URL"},
		{"down without yes", []string{"migrate", "down", "--to", "0"}, "add --yes"},
		{"bad log level", []string{"relay", "--log-level", "loud", "--brokers", "127.0.0.1:1"}, "--log-level"},
		{"dev broker busy port", []string{"dev-kafka", "--listen", "256.0.0.1:9092"}, "dev broker"},
		{"dev broker busy port names the flag", []string{"dev-kafka", "--listen", "256.0.0.1:9092"}, "pick another --listen port"},
		{"dev broker negative partitions", []string{"dev-kafka", "--partitions", "-1"}, "--partitions -1: use a positive number"},
		// The library's errors name ClientConfig fields; the CLI names its flags.
		{"tls cert without key", []string{"relay", "--brokers", "127.0.0.1:1", "--tls-cert", "/x.pem"}, "needs both --tls-cert and --tls-key"},
		{"sasl without user", []string{"relay", "--brokers", "127.0.0.1:1", "--sasl-mechanism", "PLAIN", "--sasl-user", ""}, "needs a user (--sasl-user or KAFKA_SASL_USER)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := outbox(t, tc.args...)
			require.NotEqual(t, 0, code)
			require.Contains(t, stderr, tc.want)
			require.Equal(t, 1, strings.Count(strings.TrimSpace(stderr), "\n")+1, "one line: %q", stderr)
			require.NotContains(t, stderr, "pw", "no secrets in errors")
		})
	}
}

func TestRelayUnreachableBrokerSaysWhatToDo(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there now
	code, _, stderr := outbox(t, "relay", "--database-url", db.URL, "--schema", db.Tables.Schema, "--brokers", addr)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "cannot reach Kafka at "+addr)
	require.Contains(t, stderr, "outbox dev-kafka")
}

func TestMigrateUpTwiceAndStatus(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{NoMigrate: true})
	flags := []string{"--database-url", db.URL, "--schema", db.Tables.Schema}

	code, out, stderr := outbox(t, append([]string{"migrate", "status"}, flags...)...)
	require.Equal(t, 1, code, stderr)
	require.Contains(t, out, "version 0 of")
	require.Contains(t, stderr, "run 'outbox migrate up'")

	code, out, stderr = outbox(t, append([]string{"migrate", "up"}, flags...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "applied version 1")

	code, out, _ = outbox(t, append([]string{"migrate", "up"}, flags...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "is up to date")

	code, out, _ = outbox(t, append([]string{"migrate", "status"}, flags...)...)
	require.Equal(t, 0, code)
	require.NotContains(t, out, "pending")
}

// A relay process started on a migrated outbox with a broker publishes,
// and exits 0 on cancellation (SIGTERM arrives as context cancellation).
func TestRelayCommandPublishesAndStopsCleanly(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	b, err := devkafka.Start(devkafka.Config{})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	_, err = db.Pool.Exec(context.Background(), "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload) SELECT gen_random_uuid(), 'order.placed', '{}' FROM generate_series(1, 100)")
	require.NoError(t, err)

	root := cli.NewRoot(&bytes.Buffer{}, &bytes.Buffer{})
	root.SetArgs([]string{"relay", "--database-url", db.URL, "--schema", db.Tables.Schema, "--brokers", b.Addr(), "--poll-interval", "50ms"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Tables.OutboxIdent()+" WHERE dispatched_at IS NULL").Scan(&n))
		return n == 0
	}, 30*time.Second, 50*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop")
	}
}
