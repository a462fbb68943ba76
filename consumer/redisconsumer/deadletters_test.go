package redisconsumer_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/consumer/redisconsumer"
)

// A dead letter lists with its reason and origin, without leaving the
// dead-letter stream; replayed, it is added to its stream with exactly
// its original fields, stays a dead letter, and is processed once by the
// fixed consumer.
func TestDeadLettersListAndReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	msgs := events(3, []uuid.UUID{uuid.New()})
	msgs[1].Headers = map[string]string{"x-note": "kept"}
	b.publish(t, msgs)
	var refuse atomic.Bool
	refuse.Store(true)
	handler := func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		if refuse.Load() && ev.ID == 2 {
			return consumer.Permanent(errors.New("no price for sku 42"))
		}
		return record(ctx, tx, ev)
	}
	withHandler := func(c *redisconsumer.Config) {
		c.Dispatcher.Handlers = map[string]consumer.Handler{"order.placed": handler}
	}
	dlqKey := b.stream + ":dlq"
	stop := run(t, b.consumer(t, "c1", withHandler))
	require.Eventually(t, func() bool { return len(b.effects(t)) == 2 && b.client.XLen(ctx, dlqKey).Val() == 1 }, 30*time.Second, 50*time.Millisecond)
	stop()

	store, err := redisconsumer.NewDeadLetters(b.client)
	require.NoError(t, err)
	letters, err := store.List(ctx, dlqKey)
	require.NoError(t, err)
	require.Len(t, letters, 1)
	l := letters[0]
	require.Equal(t, dlqKey, l.Destination)
	require.Equal(t, b.stream, l.OriginalTopic)
	require.Equal(t, int64(2), l.EventID)
	require.Equal(t, "order.placed", l.Type)
	require.Equal(t, msgs[1].AggregateID.String(), string(l.Key))
	require.Equal(t, `{"n": 2}`, string(l.Payload))
	require.Contains(t, l.Error, "no price for sku 42")
	for _, h := range l.Headers {
		require.NotContains(t, []string{redisconsumer.FieldDLQReason, redisconsumer.FieldDLQStream, redisconsumer.FieldDLQID}, h.Key)
	}
	require.Equal(t, int64(1), b.client.XLen(ctx, dlqKey).Val(), "listing consumes nothing")

	n, err := store.Replay(ctx, letters)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	entries, err := b.client.XRange(ctx, b.stream, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 4)
	require.Equal(t, entries[1].Values, entries[3].Values, "the replayed entry has the original's fields, and only those")
	require.Equal(t, int64(1), b.client.XLen(ctx, dlqKey).Val(), "the dead letter stays")

	refuse.Store(false)
	stop = run(t, b.consumer(t, "c1", withHandler))
	require.Eventually(t, func() bool { return len(b.effects(t)) == 3 }, 30*time.Second, 50*time.Millisecond)
	stop()
	require.Equal(t, map[int64]int{1: 1, 2: 1, 3: 1}, b.effects(t))
}

// A dead-letter stream that does not exist holds no dead letters; a key
// that is not a stream is refused, naming what to pass; a letter with no
// origin is not replayed.
func TestDeadLettersRefuse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	store, err := redisconsumer.NewDeadLetters(b.client)
	require.NoError(t, err)
	letters, err := store.List(ctx, b.stream+":dlq")
	require.NoError(t, err)
	require.Empty(t, letters)
	require.NoError(t, b.client.Set(ctx, b.stream, "x", time.Minute).Err())
	_, err = store.List(ctx, b.stream)
	require.ErrorContains(t, err, "is a Redis string, not a stream")
	require.NoError(t, b.client.XAdd(ctx, &redis.XAddArgs{Stream: b.stream + ":dlq", Values: []any{"event_id", "5", "payload", "{}"}}).Err())
	letters, err = store.List(ctx, b.stream+":dlq")
	require.NoError(t, err)
	require.Len(t, letters, 1)
	_, err = store.Replay(ctx, letters)
	require.ErrorContains(t, err, "does not say where it was consumed from")
	_, err = redisconsumer.NewDeadLetters(nil)
	require.ErrorContains(t, err, "client is nil")
}

// List reads a dead-letter stream longer than one XRANGE page, every
// entry once, in order.
func TestDeadLettersListPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pipe := b.client.Pipeline()
	for i := 1; i <= 1201; i++ {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: b.stream + ":dlq", Values: []any{"event_id", strconv.Itoa(i), redisconsumer.FieldDLQStream, b.stream}})
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	store, err := redisconsumer.NewDeadLetters(b.client)
	require.NoError(t, err)
	letters, err := store.List(ctx, b.stream+":dlq")
	require.NoError(t, err)
	require.Len(t, letters, 1201)
	for i, l := range letters {
		require.Equal(t, int64(i+1), l.EventID)
	}
}
