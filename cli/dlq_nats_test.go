package cli

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/consumer/natsconsumer"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// On NATS, a handler that refuses an event has it published to dlq.<subject>,
// which the DLQ stream keeps; `outbox dlq list --sink nats://... --topic DLQ`
// shows it, `replay` (a dry run without --yes) publishes it back to its
// subject, and the consumer, fixed, processes it once.
func TestDLQListAndReplayNATS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 6})
	_, err := db.Pool.Exec(ctx, `CREATE TABLE applied (event_id BIGINT PRIMARY KEY, n INT NOT NULL DEFAULT 1)`)
	require.NoError(t, err)
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	natstest.AddStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"shop.>"}})
	natstest.AddStream(t, js, jetstream.StreamConfig{Name: "DLQ", Subjects: []string{"dlq.>"}})
	for id := 1; id <= 3; id++ {
		m := &nats.Msg{Subject: "shop.order", Data: []byte(`{"n": ` + strconv.Itoa(id) + `}`), Header: nats.Header{}}
		m.Header.Set(outbox.HeaderEventID, strconv.Itoa(id))
		m.Header.Set(outbox.HeaderEventType, "order.placed")
		m.Header.Set("x-note", "kept")
		m.Header.Set("Nats-Msg-Id", "src:"+strconv.Itoa(id))
		_, err := js.PublishMsg(ctx, m)
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
	runFor := func(done func(*natsconsumer.Consumer) bool) {
		t.Helper()
		c, err := natsconsumer.New(js, natsconsumer.Config{Stream: "ORDERS", Dispatcher: consumer.DispatcherConfig{Name: "billing", Pool: db.Pool, Tables: db.Tables,
			Handlers: map[string]consumer.Handler{"order.placed": apply}}})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		stopped := make(chan error, 1)
		go func() { stopped <- c.Run(rctx) }()
		require.Eventually(t, func() bool { return done(c) }, 30*time.Second, 50*time.Millisecond)
		cancel()
		require.NoError(t, <-stopped)
	}
	applied := func() int { return int(countRows(t, db, "SELECT count(*) FROM applied")) }
	runFor(func(c *natsconsumer.Consumer) bool { return c.Stats().DeadLettered == 1 && applied() == 2 })

	sink := []string{"--sink", srv.URL() + "?stream=ORDERS", "--topic", "DLQ"}
	code, out, stderr := runDLQCLI(t, append([]string{"dlq", "list"}, sink...)...)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `1\s+2\s+order.placed\s+billing\s+1\s+shop.order\s+permanent: no price for sku 42`, out)
	require.Contains(t, out, "1 dead letters; 'outbox dlq replay --topic DLQ' sends them back")

	code, out, stderr = runDLQCLI(t, append([]string{"dlq", "list", "--json"}, sink...)...)
	require.Equal(t, 0, code, stderr)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &listed), out)
	require.Len(t, listed, 1)
	require.Equal(t, float64(2), listed[0]["event_id"])
	require.Equal(t, "shop.order", listed[0]["original_topic"])
	require.Equal(t, map[string]any{"n": float64(2)}, listed[0]["payload"])
	require.Equal(t, "kept", listed[0]["headers"].(map[string]any)["x-note"])

	code, out, stderr = runDLQCLI(t, append([]string{"dlq", "replay", "--event-id", "2"}, sink...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "would send 1 dead letters back: 1 to shop.order")
	require.Contains(t, out, "dry run: nothing changed; add --yes")
	require.Len(t, natstest.ReadStream(t, js, "ORDERS", ""), 3, "a dry run sends nothing")

	code, out, stderr = runDLQCLI(t, append([]string{"dlq", "replay", "--event-id", "2", "--yes"}, sink...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "sent 1 of 1 dead letters back")

	mu.Lock()
	refuse = false
	mu.Unlock()
	runFor(func(*natsconsumer.Consumer) bool { return applied() == 3 })
	require.Equal(t, 3, int(countRows(t, db, "SELECT sum(n) FROM applied")), "each event applied once")
	replayed := natstest.ReadStream(t, js, "ORDERS", "")
	require.Len(t, replayed, 4)
	require.Equal(t, nats.Header{outbox.HeaderEventID: {"2"}, outbox.HeaderEventType: {"order.placed"}, "x-note": {"kept"}}, replayed[3].Header,
		"the replayed message carries the original headers, none of the dead letter's, no Nats-Msg-Id")
	require.Len(t, natstest.ReadStream(t, js, "DLQ", ""), 1, "the dead letter stays")

	code, _, stderr = runDLQCLI(t, "dlq", "list", "--sink", srv.URL(), "--topic", "NOPE")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `dead-letter stream "NOPE"`)
}
