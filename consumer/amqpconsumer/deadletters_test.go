package amqpconsumer_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/consumer/amqpconsumer"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/internal/rabbittest"
)

// List leaves the dead letters in their queue, in order, however often it
// runs; Replay sends each back to its exchange and routing key with its
// original headers and none of the dead-letter ones, and removes it from
// the dead-letter queue only once it was sent: a letter the server returns
// (no queue bound) stays.
func TestDeadLettersListAndReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := rabbittest.URL()
	name := "amqpdlq-" + uuid.NewString()
	conn := rabbittest.Dial(t, url)
	ch := rabbittest.Channel(t, conn)
	rabbittest.TopicQueue(t, ch, name)
	agg := uuid.NewString() // one aggregate: dead-lettered in order
	for _, id := range []string{"1", "2"} {
		require.NoError(t, ch.PublishWithContext(ctx, name, "order.placed", false, false, amqp.Publishing{Body: []byte(`{"n": ` + id + `}`),
			Headers: amqp.Table{outbox.HeaderEventID: id, outbox.HeaderEventType: "order.placed", outbox.HeaderAggregateID: agg, "x-note": "kept"}}))
	}

	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	d, err := consumer.NewDispatcher(consumer.DispatcherConfig{Name: "billing", Pool: db.Pool, Tables: db.Tables, System: "rabbitmq",
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)), Handlers: map[string]consumer.Handler{
			"order.placed": func(context.Context, pgx.Tx, consumer.Event) error { return consumer.Permanent(errors.New("no price")) },
		}})
	require.NoError(t, err)
	c, err := amqpconsumer.New(amqpconsumer.Config{URL: url, Queue: name, Dispatcher: d})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	require.Eventually(t, func() bool { return c.Stats().Acked == 2 }, 30*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	store, err := amqpconsumer.NewDeadLetters(url)
	require.NoError(t, err)
	t.Cleanup(store.Close)
	for range 2 {
		letters, err := store.List(ctx, name+".dlq")
		require.NoError(t, err)
		require.Len(t, letters, 2)
		for i, l := range letters {
			require.Equal(t, int64(i+1), l.EventID, "queue order")
			require.Equal(t, name, l.OriginalTopic)
			require.Equal(t, "billing", l.Consumer)
			require.Contains(t, l.Error, "no price")
			for _, h := range l.Headers {
				require.NotContains(t, h.Key, "dlq_")
			}
		}
	}
	requireMessages(t, ch, name+".dlq", 2, "List consumes nothing")
	_, err = store.List(ctx, name+".nope")
	require.ErrorContains(t, err, "cannot read dead-letter queue")

	letters, err := store.List(ctx, name+".dlq")
	require.NoError(t, err)
	require.NoError(t, ch.QueueUnbind(name, "order.*", name, nil))
	sent, err := store.Replay(ctx, letters)
	require.ErrorContains(t, err, "returned")
	require.Zero(t, sent)
	requireMessages(t, ch, name+".dlq", 2, "a returned letter stays")

	require.NoError(t, ch.QueueBind(name, "order.*", name, false, nil))
	sent, err = store.Replay(ctx, letters[1:])
	require.NoError(t, err)
	require.Equal(t, 1, sent)
	requireMessages(t, ch, name+".dlq", 1, "the replayed letter is removed, the other stays")
	_, err = store.Replay(ctx, letters[1:])
	require.ErrorContains(t, err, "no longer in the queue")

	back := rabbittest.Get(t, conn, name, 1, 200*time.Millisecond, 10*time.Second)
	require.Len(t, back, 1)
	require.Equal(t, "order.placed", back[0].RoutingKey)
	require.Equal(t, uint8(amqp.Persistent), back[0].DeliveryMode)
	require.Equal(t, `{"n": 2}`, string(back[0].Body))
	require.Equal(t, "2", back[0].Headers[outbox.HeaderEventID])
	require.Equal(t, "kept", back[0].Headers["x-note"])
	require.Len(t, back[0].Headers, 4, "the original headers, none of the dead letter's: %v", back[0].Headers)
}

func requireMessages(t *testing.T, ch *amqp.Channel, queue string, want int, why string) {
	t.Helper()
	// The server requeues a nacked message shortly after the nack.
	n := -1
	require.Eventually(t, func() bool {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return false
		}
		n = q.Messages
		return n == want
	}, 10*time.Second, 20*time.Millisecond, "%s: %d messages in %s, want %d", why, n, queue, want)
}
