package cli

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
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

// A RabbitMQ consumer's handler refuses an event, which goes to the
// dead-letter queue; `outbox dlq list --sink amqp://...` shows it and
// leaves it there, `replay` without --yes sends nothing, with --yes sends
// it back to its exchange and removes it from the dead-letter queue, and
// the consumer, fixed, processes it once, with its original headers.
func TestDLQListAndReplayAMQP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := rabbittest.URL()
	name := "dlqcli-" + uuid.NewString()
	conn := rabbittest.Dial(t, url)
	ch := rabbittest.Channel(t, conn)
	rabbittest.TopicQueue(t, ch, name)
	for id := 1; id <= 3; id++ {
		require.NoError(t, ch.PublishWithContext(ctx, name, "order.placed", false, false, amqp.Publishing{Body: []byte(`{"n": ` + strconv.Itoa(id) + `}`),
			Headers: amqp.Table{outbox.HeaderEventID: strconv.Itoa(id), outbox.HeaderEventType: "order.placed", "x-note": "kept"}}))
	}

	db := pgtest.New(t, pgtest.Options{MaxConns: 6})
	_, err := db.Pool.Exec(ctx, `CREATE TABLE applied (event_id BIGINT PRIMARY KEY, n INT NOT NULL DEFAULT 1)`)
	require.NoError(t, err)
	var mu sync.Mutex
	refuse := true
	var seen map[string]string
	apply := func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		mu.Lock()
		no := refuse && ev.ID == 2
		mu.Unlock()
		if no {
			return consumer.Permanent(errors.New("no price for sku 42"))
		}
		if ev.ID == 2 {
			mu.Lock()
			seen = ev.Headers
			mu.Unlock()
		}
		_, err := tx.Exec(ctx, `INSERT INTO applied (event_id) VALUES ($1) ON CONFLICT (event_id) DO UPDATE SET n = applied.n + 1`, ev.ID)
		return err
	}
	runFor := func(done func(*amqpconsumer.Consumer) bool) {
		t.Helper()
		d, err := consumer.NewDispatcher(consumer.DispatcherConfig{Name: "billing", Pool: db.Pool, Tables: db.Tables, System: "rabbitmq",
			Handlers: map[string]consumer.Handler{"order.placed": apply}})
		require.NoError(t, err)
		c, err := amqpconsumer.New(amqpconsumer.Config{URL: url, Queue: name, Dispatcher: d})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		stopped := make(chan error, 1)
		go func() { stopped <- c.Run(rctx) }()
		require.Eventually(t, func() bool { return done(c) }, 30*time.Second, 50*time.Millisecond)
		cancel()
		require.NoError(t, <-stopped)
	}
	applied := func() int { return int(countRows(t, db, "SELECT count(*) FROM applied")) }
	runFor(func(c *amqpconsumer.Consumer) bool { return c.Stats().DeadLettered == 1 && applied() == 2 })

	dest := name + ".dlq"
	sink := []string{"--sink", url, "--topic", dest}
	code, out, stderr := runDLQCLI(t, append([]string{"dlq", "list"}, sink...)...)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `1\s+2\s+order.placed\s+billing\s+1\s+`+name+`\s+permanent: no price for sku 42`, out)
	require.Contains(t, out, "1 dead letters; 'outbox dlq replay --topic "+dest+"' sends them back")

	code, out, stderr = runDLQCLI(t, append([]string{"dlq", "list", "--json"}, sink...)...)
	require.Equal(t, 0, code, stderr)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &listed), out)
	require.Len(t, listed, 1)
	require.Equal(t, float64(2), listed[0]["event_id"])
	require.Equal(t, map[string]any{"n": float64(2)}, listed[0]["payload"])
	require.Equal(t, "kept", listed[0]["headers"].(map[string]any)["x-note"])

	code, out, stderr = runDLQCLI(t, append([]string{"dlq", "replay", "--event-id", "2"}, sink...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "would send 1 dead letters back: 1 to "+name)
	require.Contains(t, out, "dry run: nothing changed; add --yes")
	requireQueueLen(t, ch, name, 0, "a dry run sends nothing")
	requireQueueLen(t, ch, dest, 1, "list and a dry run leave the dead letter")

	code, out, stderr = runDLQCLI(t, append([]string{"dlq", "replay", "--event-id", "2", "--yes"}, sink...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "sent 1 of 1 dead letters back")
	requireQueueLen(t, ch, dest, 0, "replay removes what it sent back")

	requireQueueLen(t, ch, name, 1, "replay sends it back to its exchange, routed to the queue")

	mu.Lock()
	refuse = false
	mu.Unlock()
	runFor(func(*amqpconsumer.Consumer) bool { return applied() == 3 })
	require.Equal(t, 3, int(countRows(t, db, "SELECT sum(n) FROM applied")), "each event applied once")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]string{outbox.HeaderEventID: "2", outbox.HeaderEventType: "order.placed", "x-note": "kept"}, seen,
		"the replayed message carries the original headers, none of the dead letter's")
}

func requireQueueLen(t *testing.T, ch *amqp.Channel, queue string, want int, why string) {
	t.Helper()
	// The server requeues a nacked message shortly after the nack.
	require.Eventually(t, func() bool {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return false
		}
		return q.Messages == want
	}, 10*time.Second, 20*time.Millisecond, "%s: want %d messages in %s", why, want, queue)
}
