package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/routing"
)

// emitRouted emits n events of type typ through a producer with r, the
// routing of the sink the relay publishes to.
func emitRouted(t *testing.T, db *pgtest.DB, r outbox.Routing, typ string, n int) map[int64]bool {
	t.Helper()
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables, Routing: r})
	require.NoError(t, err)
	ids := map[int64]bool{}
	for i := range n {
		var id int64
		require.NoError(t, pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
			id, err = p.Emit(context.Background(), tx, outbox.Event{AggregateID: uuid.New(), Type: typ, Payload: map[string]int{"n": i}})
			return err
		}))
		ids[id] = true
	}
	return ids
}

// consumedIDs reads the event ids of consume --json's lines, failing on
// an id printed twice.
func consumedIDs(t *testing.T, lines []string) map[int64]bool {
	t.Helper()
	got := map[int64]bool{}
	for _, line := range lines {
		var ev consumedEvent
		require.NoError(t, json.Unmarshal([]byte(line), &ev), line)
		require.False(t, got[ev.EventID], "event %d printed twice", ev.EventID)
		got[ev.EventID] = true
	}
	return got
}

// consume --sink redis:// reads the streams the relay's Redis sink
// writes, in a consumer group, and handles each event once per name: a
// second run under the same name prints nothing.
func TestConsumeRedisSink(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	prefix := "consume-" + db.Tables.Schema + "-"
	want := emitRouted(t, db, routing.Redis{TopicPrefix: prefix}, "order.placed", 20)
	sink := "redis://127.0.0.1:6379/0"

	relay := startCommand(t, db, "relay", "--sink", sink, "--topic-prefix", prefix, "--poll-interval", "50ms", "--cleanup-interval", "0")
	require.Eventually(t, func() bool { return count(t, db, "dispatched_at IS NULL") == 0 }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, relay.stop())

	c := startCommand(t, db, "consume", "--sink", sink, "--topics", prefix+"order", "--name", "billing", "--json")
	require.Eventually(t, func() bool { return len(c.lines()) >= len(want) }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, c.stop())
	require.Equal(t, want, consumedIDs(t, c.lines()))

	again := startCommand(t, db, "consume", "--sink", sink, "--topics", prefix+"order", "--name", "billing", "--json")
	time.Sleep(time.Second)
	require.NoError(t, again.stop())
	require.Empty(t, again.lines(), "everything was handled under this name")
}

// consume --sink http://host:port/path serves the webhook endpoint: it
// verifies the relay's signatures and handles each event once.
func TestConsumeWebhookSink(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 8})
	secret := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600))
	want := emitRouted(t, db, routing.Webhook{}, "order.placed", 20)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	endpoint := fmt.Sprintf("http://%s/hooks?secret_file=%s", addr, secret)

	c := startCommand(t, db, "consume", "--sink", endpoint, "--name", "billing", "--json")
	require.Eventually(t, func() bool { return strings.Contains(c.stderr.String(), "receiving webhooks") }, 30*time.Second, 20*time.Millisecond)
	relay := startCommand(t, db, "relay", "--sink", endpoint, "--poll-interval", "50ms", "--cleanup-interval", "0")
	require.Eventually(t, func() bool { return count(t, db, "dispatched_at IS NULL") == 0 }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, relay.stop())
	require.NoError(t, c.stop())
	require.Equal(t, want, consumedIDs(t, c.lines()))
}

// consume refuses a --sink it cannot use, before it connects anywhere.
func TestConsumeSinkMistakes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 2})
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--sink", "nosuch://x"}, `unknown scheme "nosuch"; use one of kafka,`},
		{[]string{"--sink", "redis://127.0.0.1:6379", "--brokers", "127.0.0.1:1", "--topics", "order"}, "--brokers is a Kafka flag"},
		{[]string{"--sink", "redis://127.0.0.1:6379", "--batch-size", "5", "--topics", "order"}, "--batch-size is a Kafka flag"},
		{[]string{"--sink", "redis://127.0.0.1:6379/0"}, "no streams: pass --topics"},
		{[]string{"--sink", "redis://u:pw@127.0.0.1:6379/0", "--topics", "order"}, "holds a password"},
		{[]string{"--sink", "http://127.0.0.1:1/hooks", "--topics", "order"}, "--topics does not apply to a webhook endpoint"},
		{[]string{"--sink", "kafka://127.0.0.1:1", "--brokers", "127.0.0.1:2"}, "takes brokers only, instead of --brokers"},
	} {
		code, _, stderr := runCLI(t, db, append([]string{"consume"}, c.args...)...)
		require.Equal(t, 1, code, "%v: %s", c.args, stderr)
		require.Contains(t, stderr, c.want, c.args)
		require.NotContains(t, stderr, ":pw@", "no password in an error")
	}
}
