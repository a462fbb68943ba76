package relay_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/pgoutbox/outbox/internal/fakesink"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/relay"
)

// emitTraced commits evs in one transaction, in a span of tp's; it returns
// the span's context.
func (b *bundle) emitTraced(t *testing.T, tp trace.TracerProvider, evs ...outbox.Event) trace.SpanContext {
	t.Helper()
	ctx, span := tp.Tracer("test").Start(context.Background(), "emit")
	defer span.End()
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := b.producer.EmitBatch(ctx, tx, evs)
		return err
	}))
	return span.SpanContext()
}

// The relayer publishes the row's trace context as the Kafka traceparent
// header, and one "send" span per batch, linked to the span each traced
// row was emitted in; untraced rows add no link.
func TestRelayPublishSpan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	agg1, agg2 := uuid.New(), uuid.New()
	sc1 := b.emitTraced(t, tp, outbox.Event{AggregateID: agg1, Type: "order.placed", Payload: 1})
	sc2 := b.emitTraced(t, tp, outbox.Event{AggregateID: agg2, Type: "payment.taken", Payload: 2})
	b.emit(t, agg2, "order.placed", 3) // no span

	run(t, b.relayer(t, func(c *relay.Config) { c.TracerProvider = tp }))
	b.waitDrained(t, 20*time.Second)
	recs := b.consume(t, 3, 20*time.Second, "order", "payment")
	byID := map[string]string{}
	for _, r := range recs {
		byID[strconv.FormatInt(r.EventID, 10)] = r.Headers["traceparent"]
	}

	var sends []sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		sends = sends[:0]
		for _, s := range exp.GetSpans().Snapshots() {
			if s.SpanKind() == trace.SpanKindProducer {
				sends = append(sends, s)
			}
		}
		return len(sends) > 0
	}, 10*time.Second, 10*time.Millisecond)
	require.Len(t, sends, 1, "one span for the batch")
	send := sends[0]
	require.Equal(t, "send", send.Name(), "two topics: the name carries none")
	attrs := attrMap(send.Attributes())
	require.Equal(t, "kafka", attrs["messaging.system"])
	require.Equal(t, "send", attrs["messaging.operation.type"])
	require.Equal(t, "3", attrs["messaging.batch.message_count"])
	require.NotContains(t, attrs, "messaging.destination.name")
	require.NotContains(t, attrs, "messaging.message.id", "per-message attributes go on the links")

	links := map[trace.SpanID]map[string]string{}
	for _, l := range send.Links() {
		links[l.SpanContext.SpanID()] = attrMap(l.Attributes)
	}
	require.Len(t, links, 2, "a link per traced row")
	for _, tc := range []struct {
		sc  trace.SpanContext
		agg uuid.UUID
	}{{sc1, agg1}, {sc2, agg2}} {
		la := links[tc.sc.SpanID()]
		require.NotNil(t, la)
		require.Equal(t, tc.agg.String(), la["messaging.kafka.message.key"])
		require.Equal(t, "00-"+tc.sc.TraceID().String()+"-"+tc.sc.SpanID().String()+"-01", byID[la["messaging.message.id"]],
			"the record carries the traceparent of the span it was emitted in")
	}
	require.Equal(t, codes.Unset, send.Status().Code)
}

// A batch with a row the broker refuses ends its span in error.
func TestRelayPublishSpanRecordsFailures(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		_, err := p.Emit(context.Background(), tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: 1})
		return err
	}))
	r, err := relay.New(relay.Config{Common: relay.Common{Pool: db.Pool, Tables: db.Tables, Sink: refuseAll{}, TracerProvider: tp, Logger: slog.New(slog.DiscardHandler)},
		PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	run(t, r)

	require.Eventually(t, func() bool { return len(exp.GetSpans()) > 0 }, 10*time.Second, 10*time.Millisecond)
	s := exp.GetSpans().Snapshots()[0]
	require.Equal(t, "send order", s.Name())
	require.Equal(t, codes.Error, s.Status().Code)
	require.Contains(t, s.Status().Description, "1 of 1 messages not acknowledged")
	require.Equal(t, relay.ReasonNotAuthorized, attrMap(s.Attributes())["error.type"])
	require.Equal(t, "order", attrMap(s.Attributes())["messaging.destination.name"])
	require.NotContains(t, attrMap(s.Attributes()), "messaging.system", "a publisher that names no system")
}

type refuseAll struct{ fakesink.Kafka }

func (refuseAll) Publish(_ context.Context, msgs []relay.Message) []error {
	errs := make([]error, len(msgs))
	for i := range errs {
		errs[i] = relay.PermanentReason(relay.ReasonNotAuthorized, errors.New("not authorised"))
	}
	return errs
}

func attrMap(attrs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, a := range attrs {
		m[string(a.Key)] = a.Value.String()
	}
	return m
}

// BenchmarkPublishSpan is the tracing work of one Publish call of 5,000
// rows that all carry a traceparent, without the broker: the per-batch
// span the relayer makes, against a span per record (the alternative it
// did not take), with the global no-op provider and with a recording SDK
// (spans dropped by a no-op exporter behind a batcher).
func BenchmarkPublishSpan(b *testing.B) {
	const n = 5000
	msgs := make([]relay.Message, n)
	tc := propagation.TraceContext{}
	for i := range msgs {
		tid, sid := trace.TraceID{1, byte(i)}, trace.SpanID{2, byte(i)}
		ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
		h := propagation.MapCarrier{}
		tc.Inject(ctx, h)
		msgs[i] = relay.Message{ID: int64(i + 1), AggregateID: uuid.New(), Type: "order.placed", Topic: "order", Headers: h}
	}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	for _, prov := range []struct {
		name string
		tp   trace.TracerProvider
	}{{"noop", otel.GetTracerProvider()}, {"sdk", sdk}} {
		b.Run("batch/"+prov.name, func(b *testing.B) {
			pub := relay.TracePublish(prov.tp, propagation.TraceContext{})
			b.ReportAllocs()
			for b.Loop() {
				pub(context.Background(), msgs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/row")
		})
		b.Run("per-record/"+prov.name, func(b *testing.B) {
			tracer := prov.tp.Tracer("bench")
			b.ReportAllocs()
			for b.Loop() {
				for i := range msgs {
					m := &msgs[i]
					sc := trace.SpanContextFromContext(tc.Extract(context.Background(), propagation.MapCarrier(m.Headers)))
					_, span := tracer.Start(context.Background(), "send "+m.Topic, trace.WithSpanKind(trace.SpanKindProducer),
						trace.WithLinks(trace.Link{SpanContext: sc}))
					if span.IsRecording() {
						span.SetAttributes(attribute.String("messaging.system", "kafka"), attribute.String("messaging.message.id", strconv.FormatInt(m.ID, 10)),
							attribute.String("messaging.kafka.message.key", m.AggregateID.String()))
					}
					span.End()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/row")
		})
	}
}

// BenchmarkRelayBatchTraced is BenchmarkRelayBatch with rows that carry a
// traceparent, with the no-op provider and with a recording SDK: what
// tracing costs a relayer end to end.
func BenchmarkRelayBatchTraced(b *testing.B) {
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	for _, prov := range []struct {
		name string
		tp   trace.TracerProvider
	}{{"noop", nil}, {"sdk", sdk}} {
		b.Run(prov.name, func(b *testing.B) {
			const batch = 1000
			db := pgtest.New(b, pgtest.Options{MaxConns: 4})
			if _, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`INSERT INTO %s (aggregate_id, type, payload, headers)
				SELECT md5('aggregate-' || (g %% 1000))::uuid, 'order.placed',
				  jsonb_build_object('order_id', g, 'customer_id', 'customer-' || (g %% 1000), 'total_cents', (g * 7919) %% 100000, 'currency', 'EUR'),
				  jsonb_build_object('traceparent', '00-' || md5('t' || g) || '-' || left(md5('s' || g), 16) || '-01')
				FROM generate_series(1, $1) g`, db.Tables.OutboxIdent()), b.N*batch); err != nil {
				b.Fatal(err)
			}
			if _, err := db.Pool.Exec(context.Background(), "VACUUM ANALYZE "+db.Tables.OutboxIdent()); err != nil {
				b.Fatal(err)
			}
			var dispatched atomic.Int64
			r, err := relay.New(relay.Config{
				Common: relay.Common{Pool: db.Pool, Sink: devBroker(b), Tables: db.Tables, BatchSize: batch, TracerProvider: prov.tp, Logger: slog.New(slog.DiscardHandler),
					Hooks: []relay.Hook{onBatch(func(res relay.BatchResult) { dispatched.Add(int64(res.Dispatched)) })}},
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			b.ResetTimer()
			go func() { done <- r.Run(ctx) }()
			deadline := time.Now().Add(time.Minute + time.Duration(b.N)*time.Second)
			for dispatched.Load() < int64(b.N*batch) {
				if time.Now().After(deadline) {
					b.Fatalf("dispatched %d of %d events", dispatched.Load(), b.N*batch)
				}
				time.Sleep(time.Millisecond)
			}
			b.StopTimer()
			cancel()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
