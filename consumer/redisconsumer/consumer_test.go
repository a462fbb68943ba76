package redisconsumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
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

func redisClient(t *testing.T) *redis.Client {
	t.Helper()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis at %s: %v", addr, err)
		}
		t.Skipf("no Redis at %s (%v)", addr, err)
	}
	return c
}

type bundle struct {
	db     *pgtest.DB
	client *redis.Client
	stream string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE effects (event_id BIGINT PRIMARY KEY, agg TEXT NOT NULL, n INT NOT NULL DEFAULT 1)`)
	require.NoError(t, err)
	b := &bundle{db: db, client: redisClient(t), stream: "redisconsumer-test-" + uuid.NewString()[:8]}
	t.Cleanup(func() { b.client.Del(context.Background(), b.stream, b.stream+":dlq") })
	return b
}

// record applies an event once per processing: a second application of
// one event bumps n, which the tests assert never happens.
func record(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, agg) VALUES ($1, $2) ON CONFLICT (event_id) DO UPDATE SET n = effects.n + 1`, ev.ID, ev.AggregateID.String())
	return err
}

// publish adds events with redispub, as the relay does.
func (b *bundle) publish(t *testing.T, msgs []relay.Message) {
	t.Helper()
	p, err := redispub.New(b.client, redispub.Config{})
	require.NoError(t, err)
	for i := range msgs {
		msgs[i].Topic = b.stream
	}
	for _, err := range p.Publish(context.Background(), msgs) {
		require.NoError(t, err)
	}
}

func (b *bundle) consumer(t *testing.T, name string, mod func(*redisconsumer.Config)) *redisconsumer.Consumer {
	t.Helper()
	cfg := redisconsumer.Config{Client: b.client, Streams: []string{b.stream}, Consumer: name, Block: 100 * time.Millisecond,
		Dispatcher: consumer.DispatcherConfig{Name: "billing", Pool: b.db.Pool, Tables: b.db.Tables,
			Handlers: map[string]consumer.Handler{"order.placed": record}, MaxAttempts: 2,
			BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}}
	if mod != nil {
		mod(&cfg)
	}
	c, err := redisconsumer.New(cfg)
	require.NoError(t, err)
	return c
}

func (b *bundle) effects(t *testing.T) map[int64]int {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT event_id, n FROM effects`)
	require.NoError(t, err)
	out := map[int64]int{}
	for rows.Next() {
		var id int64
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		out[id] = n
	}
	require.NoError(t, rows.Err())
	return out
}

func run(t *testing.T, c *redisconsumer.Consumer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() {
		cancel()
		require.NoError(t, <-done)
	}
}

func events(n int, aggs []uuid.UUID) []relay.Message {
	out := make([]relay.Message, n)
	for i := range out {
		out[i] = relay.Message{ID: int64(i + 1), AggregateID: aggs[i%len(aggs)], Type: "order.placed", Payload: []byte(fmt.Sprintf(`{"n": %d}`, i+1))}
	}
	return out
}

// Every entry is applied once, duplicates in the stream included; an
// entry of a type no handler takes goes to the dead-letter stream with
// its reason and does not stall the others; every entry ends acknowledged.
func TestConsumesOnceAndDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msgs := events(200, []uuid.UUID{uuid.New(), uuid.New(), uuid.New(), uuid.New()})
	msgs = append(msgs, msgs[10], msgs[11]) // the relay sent them again
	msgs = append(msgs, relay.Message{ID: 999, AggregateID: uuid.New(), Type: "order.unknown", Payload: []byte(`{}`)})
	b.publish(t, msgs)
	stop := run(t, b.consumer(t, "c1", nil))
	require.Eventually(t, func() bool {
		return len(b.effects(t)) == 200 && b.client.XLen(context.Background(), b.stream+":dlq").Val() == 1
	},
		60*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		p, err := b.client.XPending(context.Background(), b.stream, "billing").Result()
		return err == nil && p.Count == 0
	}, 30*time.Second, 50*time.Millisecond, "every entry acknowledged")
	stop()
	for id, n := range b.effects(t) {
		require.Equal(t, 1, n, "event %d applied %d times", id, n)
	}
	dl, err := b.client.XRange(context.Background(), b.stream+":dlq", "-", "+").Result()
	require.NoError(t, err)
	require.Equal(t, "999", dl[0].Values["event_id"])
	require.Equal(t, b.stream, dl[0].Values[redisconsumer.FieldDLQStream])
	require.Contains(t, dl[0].Values[redisconsumer.FieldDLQReason], "order.unknown")
}

// Entries a consumer read and never acknowledged (it died) are claimed by
// another once idle, and processed once.
func TestClaimsADeadConsumersEntries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.publish(t, events(30, []uuid.UUID{uuid.New(), uuid.New()}))
	require.NoError(t, b.client.XGroupCreateMkStream(ctx, b.stream, "billing", "0").Err())
	got, err := b.client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "dead", Streams: []string{b.stream, ">"}, Count: 30}).Result()
	require.NoError(t, err)
	require.Len(t, got[0].Messages, 30, "the dead consumer holds them all")
	stop := run(t, b.consumer(t, "alive", func(c *redisconsumer.Config) { c.ClaimIdle = 300 * time.Millisecond }))
	require.Eventually(t, func() bool { return len(b.effects(t)) == 30 }, 60*time.Second, 50*time.Millisecond)
	stop()
	p, err := b.client.XPending(ctx, b.stream, "billing").Result()
	require.NoError(t, err)
	require.Zero(t, p.Count)
}

func TestConfigRefuses(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{})
	for _, tc := range []struct {
		cfg  redisconsumer.Config
		want string
	}{
		{redisconsumer.Config{Streams: []string{"order"}}, "Client is nil"},
		{redisconsumer.Config{Client: c}, "Streams is empty"},
		{redisconsumer.Config{Client: c, Streams: []string{"order:dlq"}, Dispatcher: consumer.DispatcherConfig{Name: "x"}}, "dead-letter stream"},
		{redisconsumer.Config{Client: c, Streams: []string{"order"}, Count: -1, Dispatcher: consumer.DispatcherConfig{Name: "x"}}, "must be positive"},
	} {
		_, err := redisconsumer.New(tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}
