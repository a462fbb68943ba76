package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// One trace from the producer to the consumer's handler: a span around
// Emit, committed; a relayer publishes the row in a "send t" span linked to
// it; the consumer runs the handler in a "process t" span whose parent is
// the producer's span, and the handler's ctx carries that span. The
// providers are the tests' own (in-memory exporter), never the global one.
func TestTraceFromEmitToHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	// Producer: Emit inside a span, in a committed transaction.
	p, err := outbox.NewProducer(outbox.Config{Tables: b.db.Tables})
	require.NoError(t, err)
	agg := uuid.New()
	spanCtx, producerSpan := tp.Tracer("test").Start(ctx, "place order")
	var id int64
	require.NoError(t, pgx.BeginFunc(spanCtx, b.db.Pool, func(tx pgx.Tx) error {
		id, err = p.Emit(spanCtx, tx, outbox.Event{AggregateID: agg, Type: "t.placed", Payload: map[string]int{"n": 1}})
		return err
	}))
	producerSpan.End()
	producer := producerSpan.SpanContext()

	// Relayer.
	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{b.broker.Addr()}, Opts: kafkaOpts()})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	r, err := relay.New(relay.Config{
		Common:       relay.Common{Pool: b.db.Pool, Tables: b.db.Tables, Sink: kafkapub.NewPublisher(client, kafkapub.PublisherConfig{}), Logger: slog.New(slog.DiscardHandler), TracerProvider: tp},
		PollInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(rctx) }()
	t.Cleanup(func() {
		stopRelay()
		require.NoError(t, <-relayDone)
	})

	// Consumer: the handler sees its span in ctx.
	var (
		mu         sync.Mutex
		handlerSC  trace.SpanContext
		handlerHdr map[string]string
	)
	cfg := b.config(map[string]consumer.Handler{"t.placed": func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		mu.Lock()
		handlerSC, handlerHdr = trace.SpanContextFromContext(ctx), ev.Headers
		mu.Unlock()
		return record(ctx, tx, ev)
	}})
	cfg.TracerProvider = tp
	c, err := consumer.New(cfg)
	require.NoError(t, err)
	run(t, c)
	require.Eventually(t, func() bool { return len(b.effects(t)) == 1 }, 30*time.Second, 20*time.Millisecond)

	var send, process sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		send, process = nil, nil
		for _, s := range exp.GetSpans().Snapshots() {
			switch s.Name() {
			case "send t":
				send = s
			case "process t":
				process = s
			}
		}
		return send != nil && process != nil
	}, 10*time.Second, 10*time.Millisecond)

	// The record carried the producer's trace context.
	mu.Lock()
	require.Equal(t, "00-"+producer.TraceID().String()+"-"+producer.SpanID().String()+"-01", handlerHdr["traceparent"])
	// The handler ran in the consumer span.
	require.Equal(t, process.SpanContext(), handlerSC)
	mu.Unlock()

	// ONE trace: the consumer span's parent is the producer's span.
	require.Equal(t, trace.SpanKindConsumer, process.SpanKind())
	require.Equal(t, producer.TraceID(), process.SpanContext().TraceID())
	require.Equal(t, producer.SpanID(), process.Parent().SpanID())
	require.True(t, process.Parent().IsRemote())
	requireAttrs(t, process.Attributes(), map[string]string{
		"messaging.system":                   "kafka",
		"messaging.operation.type":           "process",
		"messaging.destination.name":         "t",
		"messaging.consumer.group.name":      "test",
		"messaging.message.id":               strconv.FormatInt(id, 10),
		"messaging.kafka.message.key":        agg.String(),
		"messaging.destination.partition.id": "",
	})
	require.Equal(t, codes.Unset, process.Status().Code)

	// The relayer's publish span: a root of its own, linked to the
	// producer's span.
	require.Equal(t, trace.SpanKindProducer, send.SpanKind())
	require.False(t, send.Parent().IsValid())
	require.Len(t, send.Links(), 1)
	require.Equal(t, producer.TraceID(), send.Links()[0].SpanContext.TraceID())
	require.Equal(t, producer.SpanID(), send.Links()[0].SpanContext.SpanID())
	requireAttrs(t, send.Attributes(), map[string]string{
		"messaging.system":            "kafka",
		"messaging.operation.type":    "send",
		"messaging.destination.name":  "t",
		"messaging.message.id":        strconv.FormatInt(id, 10),
		"messaging.kafka.message.key": agg.String(),
	})
	requireAttrs(t, send.Links()[0].Attributes, map[string]string{"messaging.message.id": strconv.FormatInt(id, 10)})
}

// A handler that fails marks its span as an error, one span per attempt,
// each continuing the producer's trace.
func TestProcessSpanRecordsHandlerError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	cfg := b.config(map[string]consumer.Handler{"t.placed": func(context.Context, pgx.Tx, consumer.Event) error {
		return errors.New("no stock")
	}})
	cfg.TracerProvider = tp
	cfg.MaxAttempts = 2
	c, err := consumer.New(cfg)
	require.NoError(t, err)
	run(t, c)

	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	produce(t, b.producer(t), event("t", 0, 7, "t.placed", `{}`, "traceparent", "00-"+tid.String()+"-"+sid.String()+"-01"))
	require.Eventually(t, func() bool { return c.Stats().DeadLettered == 1 }, 30*time.Second, 20*time.Millisecond)

	var failed []sdktrace.ReadOnlySpan
	for _, s := range exp.GetSpans().Snapshots() {
		if s.Name() == "process t" {
			failed = append(failed, s)
		}
	}
	require.Len(t, failed, 2, "one span per attempt")
	for _, s := range failed {
		require.Equal(t, codes.Error, s.Status().Code)
		require.Contains(t, s.Status().Description, "no stock")
		require.Equal(t, tid, s.SpanContext().TraceID())
		require.Equal(t, sid, s.Parent().SpanID())
		requireAttrs(t, s.Attributes(), map[string]string{"error.type": "handler", "messaging.message.id": "7"})
		require.NotEmpty(t, s.Events(), "the error is recorded as an event")
	}
}

// requireAttrs checks that attrs hold want; an empty wanted value only
// checks the key is present.
func requireAttrs(t *testing.T, attrs []attribute.KeyValue, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, a := range attrs {
		got[string(a.Key)] = a.Value.String()
	}
	for k, v := range want {
		require.Contains(t, got, k)
		if v != "" {
			require.Equal(t, v, got[k], k)
		}
	}
}
