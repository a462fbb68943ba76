package amqpconsumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/amqppub"
)

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	d := &consumer.Dispatcher{}
	for _, c := range []struct {
		cfg  amqpconsumer.Config
		want string
	}{
		{amqpconsumer.Config{}, "URL is required"},
		{amqpconsumer.Config{URL: "amqp://h"}, "Queue is required"},
		{amqpconsumer.Config{URL: "amqp://h", Queue: "q"}, "Dispatcher is required"},
		{amqpconsumer.Config{URL: "amqp://h", Queue: "q", Dispatcher: d, Prefetch: 70000}, "Prefetch is 70000"},
		{amqpconsumer.Config{URL: "amqp://h", Queue: "q", Dispatcher: d, DeadLetterQueue: "q"}, "DeadLetterQueue is Queue"},
		{amqpconsumer.Config{URL: "http://u:s3cret@h", Queue: "q", Dispatcher: d}, "URL"},
	} {
		_, err := amqpconsumer.New(c.cfg)
		require.ErrorContains(t, err, c.want)
		require.NotContains(t, err.Error(), "s3cret")
	}
	cfg := amqpconsumer.Config{Queue: "q"}.WithDefaults()
	require.Equal(t, "q.dlq", cfg.DeadLetterQueue)
	require.Equal(t, amqpconsumer.DefaultPrefetch, cfg.Prefetch)
}

// Events the RabbitMQ sink published are applied exactly once, each
// aggregate's in order, although some arrive twice; a message without an
// event id and an event whose handler fails for good go to the
// dead-letter queue with the reason, and the others do not wait for them.
// Every message is acknowledged in the end.
func TestConsumesExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := rabbittest.URL()
	name := "amqpconsumer-" + uuid.NewString()
	pub, err := amqppub.New(amqppub.Config{URL: url, Exchange: name})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	require.NoError(t, pub.Ping(ctx))
	conn := rabbittest.Dial(t, url)
	ch := rabbittest.Channel(t, conn)
	_, err = ch.QueueDeclare(name, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(name, "order.*", name, false, nil))
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		_, _ = ch.QueueDelete(name+".dlq", false, false, false)
		_ = ch.ExchangeDelete(name, false, false)
	})

	aggs := make([]uuid.UUID, 10)
	for i := range aggs {
		aggs[i] = uuid.New()
	}
	var msgs []relay.Message
	for i := range 200 {
		typ := "order.placed"
		if i == 77 {
			typ = "order.poison"
		}
		msgs = append(msgs, relay.Message{ID: int64(i + 1), AggregateID: aggs[i%len(aggs)], Type: typ, Topic: typ, Payload: []byte(fmt.Sprintf(`{"n": %d}`, i))})
	}
	publish := func(ms []relay.Message) {
		for i, err := range pub.Publish(ctx, ms) {
			require.NoError(t, err, ms[i].ID)
		}
	}
	publish(msgs)
	publish(msgs[:50]) // redelivered, as after a relayer's crash
	require.NoError(t, ch.PublishWithContext(ctx, name, "order.placed", false, false, amqp.Publishing{
		Headers: amqp.Table{outbox.HeaderEventType: "order.placed"}, Body: []byte(`{}`)}))

	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	_, err = db.Pool.Exec(ctx, `CREATE TABLE effects (event_id BIGINT PRIMARY KEY, aggregate_id UUID NOT NULL, applied BIGSERIAL, n INT NOT NULL DEFAULT 1)`)
	require.NoError(t, err)
	apply := func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, aggregate_id) VALUES ($1, $2) ON CONFLICT (event_id) DO UPDATE SET n = effects.n + 1`, ev.ID, ev.AggregateID)
		return err
	}
	d, err := consumer.NewDispatcher(consumer.DispatcherConfig{Name: "billing", Pool: db.Pool, Tables: db.Tables, System: "rabbitmq",
		BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		Handlers: map[string]consumer.Handler{
			"order.placed": apply,
			"order.poison": func(context.Context, pgx.Tx, consumer.Event) error {
				return consumer.Permanent(errors.New("cannot bill this order"))
			},
		}})
	require.NoError(t, err)
	c, err := amqpconsumer.New(amqpconsumer.Config{URL: url, Queue: name, Dispatcher: d, Workers: 4, Prefetch: 32})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()

	// 200 events, 50 of them twice, and the malformed message.
	require.Eventually(t, func() bool { return c.Stats().Acked == 251 }, 60*time.Second, 20*time.Millisecond, "not every message acknowledged")
	cancel()
	require.NoError(t, <-done)

	var rows, extra int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(n - 1), 0) FROM effects`).Scan(&rows, &extra))
	require.Equal(t, 199, rows, "every event but the poisoned one applied")
	require.Zero(t, extra, "none applied twice")
	var disorder int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT event_id < lag(event_id) OVER (PARTITION BY aggregate_id ORDER BY applied) AS back FROM effects) s WHERE back`).Scan(&disorder))
	require.Zero(t, disorder, "each aggregate's events applied in order")
	require.Equal(t, int64(2), c.Stats().DeadLettered)

	dead := rabbittest.Get(t, conn, name+".dlq", 2, 200*time.Millisecond, 10*time.Second)
	require.Len(t, dead, 2)
	reasons := map[string]string{}
	for _, m := range dead {
		id, _ := m.Headers[outbox.HeaderEventID].(string)
		reasons[id], _ = m.Headers[consumer.HeaderDLQError].(string)
		require.Equal(t, "billing", m.Headers[consumer.HeaderDLQConsumer])
		require.Equal(t, name, m.Headers[consumer.HeaderDLQOriginalTopic])
	}
	require.Contains(t, reasons["78"], "cannot bill this order")
	require.True(t, strings.Contains(reasons[""], "event_id"), "the malformed message's reason: %q", reasons[""])
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	require.NoError(t, err)
	require.Zero(t, q.Messages, "every message acknowledged")
}
