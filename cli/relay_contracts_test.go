package cli

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// A --contracts that cannot be loaded stops `outbox relay` at once, in
// either mode, with the contracts package's words.
func TestRelayContractsFlagRefusesABadDirectory(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{})
	bad := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(bad, "order.placed"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bad, "order.placed", "v1.schema.json"), []byte(`{"type": `), 0o644))
	for _, mode := range []string{"poll", "wal"} {
		for _, tc := range []struct{ dir, want string }{
			{filepath.Join(t.TempDir(), "missing"), "no such file or directory; --contracts names the directory"},
			{bad, "order.placed/v1.schema.json is not valid JSON"},
		} {
			code, _, stderr := runCLI(t, db, "relay", "--mode", mode, "--brokers", "127.0.0.1:1", "--contracts", tc.dir)
			require.Equal(t, 1, code, stderr)
			require.Contains(t, stderr, tc.want, mode)
		}
	}
}

// `outbox relay --contracts DIR` holds a plain-SQL row that breaks its
// contract, and `outbox stats` and `outbox watchdog` show it with reason
// contract, the pointer and the rule; the rows beside it are published
// with the event_version they were checked against.
func TestRelayContractsFlagHoldsAViolation(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	broker, err := devkafka.Start(devkafka.Config{Partitions: 3})
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "rcflag.placed"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rcflag.placed", "v3.schema.json"),
		[]byte(`{"type": "object", "properties": {"total_cents": {"type": "integer"}}}`), 0o644))

	bad := insertRow(t, db, uuid.New(), "rcflag.placed", `{"total_cents": "ten"}`)
	good := insertRow(t, db, uuid.New(), "rcflag.placed", `{"total_cents": 10}`)

	root := NewRoot(&strings.Builder{}, &strings.Builder{})
	root.SetArgs([]string{"relay", "--database-url", db.URL, "--schema", db.Tables.Schema, "--brokers", broker.Addr(), "--poll-interval", "50ms", "--contracts", dir})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	recs := kafkatest.Collect(t, broker.Addr(), 1, 30*time.Second, "rcflag")
	require.Len(t, recs, 1)
	require.Equal(t, good, recs[0].EventID)
	require.Equal(t, "3", recs[0].Headers["event_version"])
	require.Eventually(t, func() bool { _, active, ok := heldFailure(t, db, bad); return ok && active }, 10*time.Second, 20*time.Millisecond)

	code, out, stderr := runCLI(t, db, "stats")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `held\s+1\s+.*contract`, out)
	code, out, _ = runCLI(t, db, "watchdog")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, strconv.FormatInt(bad, 10))
	require.Contains(t, out, "contract")
	require.Contains(t, out, "rcflag.placed v3: at /total_cents")
	require.Contains(t, out, "rule /properties/total_cents/type")
}
