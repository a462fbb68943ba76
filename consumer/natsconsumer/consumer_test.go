package natsconsumer_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/consumer/natsconsumer"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/natspub"
)

// Events the NATS sink published are processed once each, in order per
// aggregate, a copy sent again (past the stream's dedupe) is skipped, and
// an event whose handler fails for good is dead-lettered with why while
// the events behind it, of its aggregate too, are processed.
func TestConsumesWithExactlyOnceEffects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	_, err := db.Pool.Exec(ctx, `CREATE TABLE effects (seq BIGSERIAL, agg UUID NOT NULL, event_id BIGINT NOT NULL, n INT NOT NULL DEFAULT 1, UNIQUE (event_id))`)
	require.NoError(t, err)
	srv := natstest.Start(t)
	nc, js := natstest.Connect(t, srv.URL())
	natstest.AddStream(t, js, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"e.>"}})
	natstest.AddStream(t, js, jetstream.StreamConfig{Name: "DLQ", Subjects: []string{"dlq.>"}})
	pub, err := natspub.New(nc, natspub.Config{})
	require.NoError(t, err)

	aggs := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	var msgs []relay.Message
	poison := int64(0)
	for i := range 60 {
		typ := "order.placed"
		if i == 10 {
			typ, poison = "order.poison", int64(i+1)
		}
		msgs = append(msgs, relay.Message{ID: int64(i + 1), AggregateID: aggs[i%3], Type: typ, Topic: "e." + typ,
			Payload: []byte(`{"n": ` + strconv.Itoa(i) + `}`), Headers: map[string]string{"odd key": " x "}})
	}
	for _, err := range pub.Publish(ctx, msgs) {
		require.NoError(t, err)
	}
	// A copy of event 5 the stream does not drop (another Nats-Msg-Id), as
	// after its duplicate window.
	dup := natstest.ReadStream(t, js, "EVENTS", "")[4]
	dup.Header.Set("Nats-Msg-Id", "copy")
	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: dup.Subject, Header: dup.Header, Data: dup.Data})
	require.NoError(t, err)

	apply := func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		if ev.Headers["odd key"] != " x " {
			return consumer.Permanent(errors.New("header not unescaped"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (agg, event_id) VALUES ($1, $2) ON CONFLICT (event_id) DO UPDATE SET n = effects.n + 1`, ev.AggregateID, ev.ID)
		return err
	}
	c, err := natsconsumer.New(js, natsconsumer.Config{Stream: "EVENTS", Workers: 3, Dispatcher: consumer.DispatcherConfig{
		Name: "billing", Pool: db.Pool, Tables: db.Tables, BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond,
		Handlers: map[string]consumer.Handler{
			"order.placed": apply,
			"order.poison": func(context.Context, pgx.Tx, consumer.Event) error {
				return consumer.Permanent(errors.New("cannot bill a poisoned order"))
			},
		}}})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n))
		return n == 59 && c.Stats().Duplicates == 1 && c.Stats().DeadLettered == 1
	}, 60*time.Second, 50*time.Millisecond, "stats %+v", c.Stats())
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}

	rows, err := db.Pool.Query(ctx, `SELECT agg, event_id, n FROM effects ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	last := map[uuid.UUID]int64{}
	for rows.Next() {
		var agg uuid.UUID
		var id int64
		var n int
		require.NoError(t, rows.Scan(&agg, &id, &n))
		require.Equal(t, 1, n, "event %d applied once", id)
		require.Greater(t, id, last[agg], "aggregate %s: event %d applied after %d", agg, id, last[agg])
		last[agg] = id
	}
	require.NoError(t, rows.Err())

	dl := natstest.ReadStream(t, js, "DLQ", "")
	require.Len(t, dl, 1)
	require.Equal(t, "dlq.e.order.poison", dl[0].Subject)
	require.Equal(t, strconv.FormatInt(poison, 10), dl[0].Header.Get(outbox.HeaderEventID))
	require.Contains(t, dl[0].Header.Get(natsconsumer.HeaderDLQError), "cannot bill a poisoned order")
	require.Equal(t, "e.order.poison", dl[0].Header.Get(natsconsumer.HeaderDLQOriginalSubject))
	require.Equal(t, "billing", dl[0].Header.Get(natsconsumer.HeaderDLQConsumer))
	require.Equal(t, `{"n": 10}`, string(dl[0].Data))
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	d := natsconsumer.Config{Stream: "S", Dispatcher: consumer.DispatcherConfig{Name: "n"}}.WithDefaults()
	require.NoError(t, d.Validate())
	require.Equal(t, "n", d.Durable)
	require.Equal(t, "nats", d.Dispatcher.System)
	require.Equal(t, natsconsumer.DefaultWorkers, d.Workers)
	for cfg, want := range map[*natsconsumer.Config]string{
		{Dispatcher: consumer.DispatcherConfig{Name: "n"}}: "Config.Stream is empty",
		{Stream: "S"}:                                                        "Config.Durable is empty",
		{Stream: "S", Durable: "d", Workers: -1}:                             "Workers is -1",
		{Stream: "S", Durable: "d", AckWait: time.Millisecond}:               "AckWait is 1ms",
		{Stream: "S", Durable: "d", ShutdownGrace: -time.Second, Workers: 1}: "ShutdownGrace is -1s",
	} {
		require.ErrorContains(t, cfg.WithDefaults().Validate(), want)
	}
}
