package cli

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/consumer/redisconsumer"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/redispub"
)

// TestDLQListAndReplay on Redis Streams: the consumer's dead letter in
// <stream>:dlq lists, a dry run sends nothing, --yes adds it back to its
// stream with its own fields only, and the fixed consumer processes it
// once.
func TestDLQRedisListAndReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := "127.0.0.1:6379"
	client := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { client.Close() })
	if err := client.Ping(ctx).Err(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis at %s: %v", addr, err)
		}
		t.Skipf("no Redis at %s (%v)", addr, err)
	}
	stream := "dlq-cli-" + uuid.NewString()[:8]
	dlqKey := stream + ":dlq"
	t.Cleanup(func() { client.Del(context.Background(), stream, dlqKey) })
	db := pgtest.New(t, pgtest.Options{MaxConns: 6})
	_, err := db.Pool.Exec(ctx, `CREATE TABLE applied (event_id BIGINT PRIMARY KEY, n INT NOT NULL DEFAULT 1)`)
	require.NoError(t, err)
	pub, err := redispub.New(client, redispub.Config{})
	require.NoError(t, err)
	agg := uuid.New()
	var msgs []relay.Message
	for id := int64(1); id <= 3; id++ {
		msgs = append(msgs, relay.Message{ID: id, Topic: stream, AggregateID: agg, Type: "order.placed",
			Payload: []byte(`{"n": ` + strconv.FormatInt(id, 10) + `}`), Headers: map[string]string{"x-note": "kept"}})
	}
	for _, err := range pub.Publish(ctx, msgs) {
		require.NoError(t, err)
	}

	var mu sync.Mutex
	refuse := true
	apply := func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		mu.Lock()
		no := refuse && ev.ID == 2
		mu.Unlock()
		if no {
			return consumer.Permanent(errors.New("no price for sku 42"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO applied (event_id) VALUES ($1) ON CONFLICT (event_id) DO UPDATE SET n = applied.n + 1`, ev.ID)
		return err
	}
	runFor := func(done func(*redisconsumer.Consumer) bool) {
		t.Helper()
		c, err := redisconsumer.New(redisconsumer.Config{Client: client, Streams: []string{stream}, Consumer: "c1", Block: 100 * time.Millisecond,
			Dispatcher: consumer.DispatcherConfig{Name: "billing", Pool: db.Pool, Tables: db.Tables, Handlers: map[string]consumer.Handler{"order.placed": apply}}})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		stopped := make(chan error, 1)
		go func() { stopped <- c.Run(rctx) }()
		require.Eventually(t, func() bool { return done(c) }, 30*time.Second, 50*time.Millisecond)
		cancel()
		require.NoError(t, <-stopped)
	}
	applied := func() int { return int(countRows(t, db, "SELECT count(*) FROM applied")) }
	runFor(func(c *redisconsumer.Consumer) bool { return c.Stats().DeadLettered == 1 && applied() == 2 })

	sink := []string{"--sink", "redis://" + addr + "/0", "--topic", dlqKey}
	code, out, stderr := runDLQCLI(t, append([]string{"dlq", "list"}, sink...)...)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `\d+-\d+\s+2\s+order.placed\s+\S+\s+0\s+`+stream+`\s+permanent: no price for sku 42`, out)
	require.Contains(t, out, "1 dead letters; 'outbox dlq replay --topic "+dlqKey+"' sends them back")

	code, out, stderr = runDLQCLI(t, append([]string{"dlq", "list", "--json"}, sink...)...)
	require.Equal(t, 0, code, stderr)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &listed), out)
	require.Len(t, listed, 1)
	require.Equal(t, float64(2), listed[0]["event_id"])
	require.Equal(t, stream, listed[0]["original_topic"])
	require.Equal(t, map[string]any{"n": float64(2)}, listed[0]["payload"])
	require.Equal(t, "kept", listed[0]["headers"].(map[string]any)["header:x-note"])

	code, out, stderr = runDLQCLI(t, append([]string{"dlq", "replay", "--event-id", "2"}, sink...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "would send 1 dead letters back: 1 to "+stream)
	require.Contains(t, out, "dry run: nothing changed; add --yes")
	require.Equal(t, int64(3), client.XLen(ctx, stream).Val(), "a dry run sends nothing")

	code, out, stderr = runDLQCLI(t, append([]string{"dlq", "replay", "--event-id", "2", "--yes"}, sink...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "sent 1 of 1 dead letters back")
	require.Equal(t, int64(1), client.XLen(ctx, dlqKey).Val(), "the dead letter stays")

	mu.Lock()
	refuse = false
	mu.Unlock()
	runFor(func(*redisconsumer.Consumer) bool { return applied() == 3 })
	require.Equal(t, 3, int(countRows(t, db, "SELECT sum(n) FROM applied")), "each event applied once")
	entries, err := client.XRange(ctx, stream, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 4)
	require.Equal(t, entries[1].Values, entries[3].Values, "the replayed entry carries the original's fields, none of the dead letter's")
}

// dlq --sink redis:// refuses a password in the URL, pointing at the
// environment variable.
func TestDLQRedisRefusesPasswordInURL(t *testing.T) {
	t.Parallel()
	code, _, stderr := runDLQCLI(t, "dlq", "list", "--sink", "redis://u:secret@127.0.0.1:6379/0", "--topic", "order:dlq")
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, "set OUTBOX_REDIS_PASSWORD instead")
	require.NotContains(t, stderr, "secret")
}
