package walrelay_test

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/ops/monitor"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/walrelay"
)

// monitor.Metrics, as a hook of the WAL source, sees its batches as it sees
// the polling relay's: the events dispatched by topic, and an event
// parked for good as a hold with its reason and a permanent publish
// error the relayer refused itself.
func TestMetricsHookSeesWALBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := monitor.NewMetrics()
	r := b.relayer(t, func(c *walrelay.Config) { c.Hooks = []relay.Hook{m} })
	run(t, r)
	waitLeading(t, r)
	for range 3 {
		b.insert(t, "order.placed", `{}`)
	}
	b.insert(t, "payment.captured", `{}`)
	// A row whose headers set one the relayer sets itself: refused by the
	// relayer and parked. Migration 6 refuses it at INSERT: it is one
	// written before.
	b.db.WriteLegacy(t, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+b.db.Tables.OutboxIdent()+` (aggregate_id, type, payload, headers) VALUES ($1, 'order.placed', '{}', '{"event_id": "forged"}')`, uuid.New())
		return err
	})

	metric := func(name string, labels map[string]string) float64 {
		families, err := m.Registry().Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
		next:
			for _, mt := range f.GetMetric() {
				got := map[string]string{}
				for _, l := range mt.GetLabel() {
					got[l.GetName()] = l.GetValue()
				}
				for k, v := range labels {
					if got[k] != v {
						continue next
					}
				}
				return mt.GetCounter().GetValue()
			}
		}
		return 0
	}
	require.Eventually(t, func() bool {
		return metric("outbox_events_dispatched_total", map[string]string{"topic": "order"}) == 3 &&
			metric("outbox_events_dispatched_total", map[string]string{"topic": "payment"}) == 1 &&
			metric("outbox_holds_total", map[string]string{"reason": relay.ReasonReservedHeader}) == 1
	}, 30*time.Second, 20*time.Millisecond, "dispatched order=%v payment=%v, holds reserved_header=%v",
		metric("outbox_events_dispatched_total", map[string]string{"topic": "order"}),
		metric("outbox_events_dispatched_total", map[string]string{"topic": "payment"}),
		metric("outbox_holds_total", map[string]string{"reason": relay.ReasonReservedHeader}))
	require.Equal(t, 1.0, metric("outbox_publish_errors_total", map[string]string{"kind": "permanent", "code": monitor.CodeRejectedByRelay}))
	require.Positive(t, metric("outbox_batches_total", nil))
	st := r.Stats()
	require.EqualValues(t, 4, st.Dispatched)
	require.EqualValues(t, 1, st.Parked)
	require.EqualValues(t, 1, st.PermanentFailures)
	require.GreaterOrEqual(t, st.Claimed, int64(5))
}

// One trace from Emit through the WAL source to a consumer: the WAL's
// "send t" span (kind producer) links to the span Emit ran in, and the
// consumer's "process t" span continues that trace, its parent the
// producer's span.
func TestTraceFromEmitThroughWALToConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	r := b.relayer(t, func(c *walrelay.Config) { c.TracerProvider = tp })
	run(t, r)
	waitLeading(t, r)

	agg := uuid.New()
	spanCtx, producerSpan := tp.Tracer("test").Start(ctx, "place order")
	var id int64
	require.NoError(t, pgx.BeginFunc(spanCtx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = b.producer.Emit(spanCtx, tx, outbox.Event{AggregateID: agg, Type: "t.placed", Payload: map[string]int{"n": 1}})
		return err
	}))
	producerSpan.End()
	producer := producerSpan.SpanContext()

	var (
		mu        sync.Mutex
		handlerSC trace.SpanContext
	)
	c, err := consumer.New(consumer.Config{
		Name: "trace", Pool: b.db.Pool, Tables: b.db.Tables,
		Client: kafka.ClientConfig{Brokers: []string{b.broker.Addr()}, Opts: []kgo.Opt{kgo.FetchMaxWait(100 * time.Millisecond)}},
		Logger: slog.New(slog.DiscardHandler),
		Topics: []string{"t"}, TracerProvider: tp,
		Handlers: map[string]consumer.Handler{"t.placed": func(ctx context.Context, _ pgx.Tx, _ consumer.Event) error {
			mu.Lock()
			handlerSC = trace.SpanContextFromContext(ctx)
			mu.Unlock()
			return nil
		}},
	})
	require.NoError(t, err)
	cctx, stopConsumer := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() { consumed <- c.Run(cctx) }()
	t.Cleanup(func() {
		stopConsumer()
		<-consumed
	})

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
	}, 30*time.Second, 20*time.Millisecond, "no send or process span")

	require.Equal(t, trace.SpanKindProducer, send.SpanKind())
	require.False(t, send.Parent().IsValid(), "the send span is a root of its own")
	require.Len(t, send.Links(), 1)
	require.Equal(t, producer.TraceID(), send.Links()[0].SpanContext.TraceID())
	require.Equal(t, producer.SpanID(), send.Links()[0].SpanContext.SpanID())
	attrs := map[string]string{}
	for _, a := range send.Attributes() {
		attrs[string(a.Key)] = a.Value.String()
	}
	require.Equal(t, "kafka", attrs["messaging.system"])
	require.Equal(t, "t", attrs["messaging.destination.name"])
	require.Equal(t, strconv.FormatInt(id, 10), attrs["messaging.message.id"])

	require.Equal(t, trace.SpanKindConsumer, process.SpanKind())
	require.Equal(t, producer.TraceID(), process.SpanContext().TraceID())
	require.Equal(t, producer.SpanID(), process.Parent().SpanID())
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, process.SpanContext(), handlerSC, "the handler ran in the consumer's span")
}
