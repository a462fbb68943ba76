package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
)

func (b *bundle) dispatcher(t *testing.T, cfg consumer.DispatcherConfig) *consumer.Dispatcher {
	t.Helper()
	cfg.Name, cfg.Pool, cfg.Tables = "loyalty", b.db.Pool, b.db.Tables
	if cfg.Handlers == nil && cfg.DefaultHandler == nil {
		cfg.Handlers = map[string]consumer.Handler{"order.placed": record}
	}
	cfg.BackoffMin, cfg.BackoffMax = time.Millisecond, 5*time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	d, err := consumer.NewDispatcher(cfg)
	require.NoError(t, err)
	require.NoError(t, d.Check(context.Background()))
	return d
}

// delivery is a message as a transport without record keys carries it.
func delivery(id, typ, payload string, extra ...string) consumer.Delivery {
	h := map[string]string{outbox.HeaderEventType: typ}
	if id != "" {
		h[outbox.HeaderEventID] = id
	}
	for i := 0; i+1 < len(extra); i += 2 {
		h[extra[i]] = extra[i+1]
	}
	return consumer.Delivery{Topic: "orders.placed", Key: "7d0c6f5e-9a5b-4d64-8f59-0d0b4ad2c1b3", Payload: []byte(payload), Headers: h}
}

// A message is applied once however often it comes: the first delivery is
// processed, every redelivery is Done as a duplicate, and the event the
// handler sees carries what the transport delivered.
func TestDispatchAppliesEachEventOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := dbOnly(t)
	var seen consumer.Event
	d := b.dispatcher(t, consumer.DispatcherConfig{Handlers: map[string]consumer.Handler{
		"order.placed": func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
			seen = ev
			return record(ctx, tx, ev)
		},
	}})
	m := delivery("41", "order.placed", `{"total": 3}`, outbox.HeaderEventSource, "shop", "x-note", "hi")
	res := d.Dispatch(ctx, ctx, m)
	require.Equal(t, consumer.Done, res.Verdict)
	require.Equal(t, consumer.Processed, res.Outcome)
	for range 3 {
		res = d.Dispatch(ctx, ctx, m)
		require.Equal(t, consumer.Done, res.Verdict)
		require.Equal(t, consumer.Duplicate, res.Outcome)
	}
	require.Equal(t, map[string]int{"shop/41": 1}, b.effects(t))
	require.Equal(t, int64(41), seen.ID)
	require.Equal(t, "shop", seen.Source)
	require.Equal(t, uuid.MustParse("7d0c6f5e-9a5b-4d64-8f59-0d0b4ad2c1b3"), seen.AggregateID)
	require.Equal(t, "orders.placed", seen.Topic)
	require.Equal(t, "hi", seen.Headers["x-note"])
	require.Equal(t, consumer.DispatcherStats{Processed: 1, Duplicates: 3}, d.Stats())
}

// Each malformed shape is a DeadLetter verdict at once, with its reason,
// and never reaches a handler.
func TestDispatchDeadLettersMalformedAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := dbOnly(t)
	var calls atomic.Int64
	d := b.dispatcher(t, consumer.DispatcherConfig{Handlers: map[string]consumer.Handler{
		"order.placed": func(context.Context, pgx.Tx, consumer.Event) error { calls.Add(1); return nil },
	}})
	for _, c := range []struct {
		m    consumer.Delivery
		want string
	}{
		{delivery("", "order.placed", `{}`), "no event_id header"},
		{delivery("-3", "order.placed", `{}`), "is not a positive decimal integer"},
		{delivery("5", "order.placed", `{"a":`), "is not valid JSON"},
		{delivery("6", "order.placed", "\"\xff\""), "not valid UTF-8"},
		{delivery("7", "order.shipped", `{}`), `no handler for event type "order.shipped"`},
		{delivery("8", "order.placed", `{}`, outbox.HeaderEventSource, "a\x00b"), "event_source header"},
	} {
		res := d.Dispatch(ctx, ctx, c.m)
		require.Equal(t, consumer.DeadLetter, res.Verdict, c.want)
		require.True(t, res.Malformed, c.want)
		require.Contains(t, res.Reason, c.want)
		require.Zero(t, res.Attempts)
		_, err := d.Decode(c.m)
		var me *consumer.MalformedError
		require.ErrorAs(t, err, &me, c.want)
	}
	require.Zero(t, calls.Load(), "no malformed message reaches a handler")
	require.Equal(t, int64(6), d.Stats().Malformed)
	require.Equal(t, int64(6), d.Stats().DeadLettered)
	require.Zero(t, b.processedRows(t))
}

// A failing handler runs MaxAttempts times, then the message is to be
// dead-lettered with its last error; a Permanent error after one attempt.
// Neither is recorded as processed.
func TestDispatchRetriesThenDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := dbOnly(t)
	var calls atomic.Int64
	d := b.dispatcher(t, consumer.DispatcherConfig{MaxAttempts: 3, Handlers: map[string]consumer.Handler{
		"order.placed": func(context.Context, pgx.Tx, consumer.Event) error {
			calls.Add(1)
			return errors.New("inventory service said no")
		},
		"order.voided": func(context.Context, pgx.Tx, consumer.Event) error {
			calls.Add(1)
			return consumer.Permanent(errors.New("voided orders are not ours"))
		},
	}})
	res := d.Dispatch(ctx, ctx, delivery("1", "order.placed", `{}`))
	require.Equal(t, consumer.DeadLetter, res.Verdict)
	require.False(t, res.Malformed)
	require.Equal(t, 3, res.Attempts)
	require.Equal(t, "inventory service said no", res.Reason)
	require.Equal(t, int64(3), calls.Load())
	require.Equal(t, int64(2), d.Stats().Retries)

	res = d.Dispatch(ctx, ctx, delivery("2", "order.voided", `{}`))
	require.Equal(t, consumer.DeadLetter, res.Verdict)
	require.Equal(t, 1, res.Attempts)
	require.Contains(t, res.Reason, "voided orders are not ours")
	require.Equal(t, int64(4), calls.Load())
	require.Zero(t, b.processedRows(t), "a dead-lettered event is not processed: replayed, it is processed then")
}

// A handler that fails until stop ends leaves the message Stopped (the
// transport leaves it unacknowledged), not dead-lettered.
func TestDispatchStopsWhileRetrying(t *testing.T) {
	t.Parallel()
	b := dbOnly(t)
	d := b.dispatcher(t, consumer.DispatcherConfig{MaxAttempts: 1000, Handlers: map[string]consumer.Handler{
		"order.placed": func(context.Context, pgx.Tx, consumer.Event) error { return errors.New("down") },
	}})
	stop, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	res := d.Dispatch(stop, context.Background(), delivery("1", "order.placed", `{}`))
	require.Equal(t, consumer.Stopped, res.Verdict)
	require.Empty(t, res.Reason)
	require.Equal(t, int64(1), res.Event.ID)
}

// Every handler call runs in a "process <topic>" span of the configured
// messaging system, without Kafka's partition and offset.
func TestDispatchSpanNamesTheSystem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := dbOnly(t)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	d := b.dispatcher(t, consumer.DispatcherConfig{System: "nats", TracerProvider: tp})
	require.Equal(t, consumer.Done, d.Dispatch(ctx, ctx, delivery("9", "order.placed", `{}`)).Verdict)
	ended := spans.Ended()
	require.Len(t, ended, 1)
	require.Equal(t, "process orders.placed", ended[0].Name())
	attrs := map[attribute.Key]string{}
	for _, a := range ended[0].Attributes() {
		attrs[a.Key] = a.Value.String()
	}
	require.Equal(t, "nats", attrs["messaging.system"])
	require.Equal(t, "9", attrs["messaging.message.id"])
	require.NotContains(t, attrs, attribute.Key("messaging.kafka.offset"))
}

// A config the Dispatcher cannot use is refused, naming the field.
func TestDispatcherConfigRefusals(t *testing.T) {
	t.Parallel()
	b := dbOnly(t)
	for _, c := range []struct {
		cfg  consumer.DispatcherConfig
		want string
	}{
		{consumer.DispatcherConfig{}, "no handlers"},
		{consumer.DispatcherConfig{Handlers: map[string]consumer.Handler{"a": nil}}, `handler for event type "a" is nil`},
		{consumer.DispatcherConfig{DefaultHandler: record, MaxAttempts: -1}, "MaxAttempts is -1"},
		{consumer.DispatcherConfig{DefaultHandler: record, BackoffMin: time.Second, BackoffMax: time.Millisecond}, "BackoffMax (1ms) is below BackoffMin (1s)"},
	} {
		c.cfg.Name, c.cfg.Pool = "x", b.db.Pool
		_, err := consumer.NewDispatcher(c.cfg)
		require.ErrorContains(t, err, c.want)
	}
	_, err := consumer.NewDispatcher(consumer.DispatcherConfig{Pool: b.db.Pool, DefaultHandler: record})
	require.Error(t, err, "Name is required")
}
