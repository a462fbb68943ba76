package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

// spanContext returns ctx holding a sampled span context with trace state,
// as an OpenTelemetry SDK span would: Emit needs the API only.
func spanContext(t *testing.T, state string) (context.Context, string) {
	t.Helper()
	tid, err := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	require.NoError(t, err)
	ts, err := trace.ParseTraceState(state)
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts})
	return trace.ContextWithSpanContext(context.Background(), sc), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
}

func storedHeaders(t *testing.T, db *pgtest.DB, id int64) map[string]string {
	t.Helper()
	var h map[string]string
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT headers FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", id).Scan(&h))
	return h
}

// Every producer path writes the span's trace context into the row's
// headers, and none writes any without a span.
func TestEmitInjectsTraceContext(t *testing.T) {
	t.Parallel()
	db, p := setup(t, outbox.Config{})
	traced, tp := spanContext(t, "vendor=abc")
	want := map[string]string{"traceparent": tp, "tracestate": "vendor=abc"}
	ev := func() outbox.Event {
		return outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: 1}
	}
	sqlDB, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })
	paths := map[string]func(ctx context.Context) []int64{
		"Emit": func(ctx context.Context) []int64 {
			var id int64
			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) (err error) {
				id, err = p.Emit(ctx, tx, ev())
				return err
			}))
			return []int64{id}
		},
		"EmitBatch": func(ctx context.Context) []int64 {
			var ids []int64
			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) (err error) {
				ids, err = p.EmitBatch(ctx, tx, []outbox.Event{ev(), ev()})
				return err
			}))
			return ids
		},
		"QueueEmit": func(ctx context.Context) []int64 {
			batch := &pgx.Batch{}
			q, err := p.QueueEmit(ctx, batch, ev())
			require.NoError(t, err)
			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, batch).Close() }))
			return []int64{q.ID}
		},
		"EmitSQL": func(ctx context.Context) []int64 {
			tx, err := sqlDB.BeginTx(ctx, nil)
			require.NoError(t, err)
			id, err := p.EmitSQL(ctx, tx, ev())
			require.NoError(t, err)
			require.NoError(t, tx.Commit())
			return []int64{id}
		},
		"EmitBatchSQL": func(ctx context.Context) []int64 {
			tx, err := sqlDB.BeginTx(ctx, nil)
			require.NoError(t, err)
			ids, err := p.EmitBatchSQL(ctx, tx, []outbox.Event{ev(), ev()})
			require.NoError(t, err)
			require.NoError(t, tx.Commit())
			return ids
		},
	}
	for name, emit := range paths {
		for _, id := range emit(context.Background()) {
			require.Nil(t, storedHeaders(t, db, id), "%s without a span adds no headers", name)
		}
		for _, id := range emit(traced) {
			require.Equal(t, want, storedHeaders(t, db, id), "%s in a span", name)
		}
	}
}

// A traceparent the caller set is kept, with no tracestate of the span's
// added to it; the caller's other headers stay, and the caller's map is
// not modified.
func TestEmitKeepsCallersTraceContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := setup(t, outbox.Config{})
	traced, tp := spanContext(t, "vendor=abc")

	own := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "t-1"}
	user := map[string]string{"tenant": "t-1"}
	var kept, merged int64
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) (err error) {
		if kept, err = p.Emit(traced, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: 1, Headers: own}); err != nil {
			return err
		}
		merged, err = p.Emit(traced, tx, outbox.Event{AggregateID: uuid.New(), Type: "order.placed", Payload: 1, Headers: user})
		return err
	}))
	require.Equal(t, own, storedHeaders(t, db, kept))
	require.Equal(t, map[string]string{"traceparent": tp, "tracestate": "vendor=abc", "tenant": "t-1"}, storedHeaders(t, db, merged))
	require.Equal(t, map[string]string{"tenant": "t-1"}, user, "the caller's map is not modified")

	// A propagator's other headers (baggage here) do not overwrite the
	// caller's either.
	p2, err := outbox.NewProducer(outbox.Config{Tables: db.Tables, Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, fixedHeader{"tenant", "from-propagator"})})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"traceparent": tp, "tracestate": "vendor=abc", "tenant": "t-1"}, outbox.TraceHeaders(p2, traced, user))
	require.Equal(t, map[string]string{"traceparent": tp, "tracestate": "vendor=abc", "tenant": "from-propagator"}, outbox.TraceHeaders(p2, traced, nil))
}

// fixedHeader is a propagator that writes one header.
type fixedHeader struct{ k, v string }

func (f fixedHeader) Inject(_ context.Context, c propagation.TextMapCarrier) { c.Set(f.k, f.v) }
func (fixedHeader) Extract(ctx context.Context, _ propagation.TextMapCarrier) context.Context {
	return ctx
}
func (f fixedHeader) Fields() []string { return []string{f.k} }

// The injected headers count toward MaxRecordBytes: an event that fits
// exactly without a span is refused in one, before any SQL runs.
func TestEmitSizeCheckCountsTraceContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const limit = 4096
	db, p := setup(t, outbox.Config{MaxRecordBytes: limit})
	traced, tp := spanContext(t, "")
	typ := "order.placed"
	n := 0
	for (outbox.KafkaRouting{}).Size(typ, n, nil) < limit {
		n++
	}
	require.Equal(t, limit, outbox.KafkaRouting{}.Size(typ, n, nil))
	ev := outbox.Event{AggregateID: uuid.New(), Type: typ, Payload: json.RawMessage(`{"s":"` + strings.Repeat("x", n-len(`{"s": ""}`)) + `"}`)}

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = p.Emit(traced, tx, ev)
	require.ErrorIs(t, err, outbox.ErrPayloadTooLarge)
	require.ErrorContains(t, err, "makes a record of "+strconv.Itoa(outbox.KafkaRouting{}.Size(typ, n, map[string]string{"traceparent": tp}))+" bytes")
	_, err = p.EmitBatch(traced, tx, []outbox.Event{ev})
	require.ErrorIs(t, err, outbox.ErrPayloadTooLarge)
	// Nothing was sent: the transaction is still usable, and the same
	// event without a span fits.
	id, err := p.Emit(ctx, tx, ev)
	require.NoError(t, err)
	require.Positive(t, id)
}

// Without a span, injection allocates nothing and returns the caller's
// headers as they are. (Not parallel: AllocsPerRun counts the process's
// allocations.)
func TestTraceInjectionWithoutSpanIsFree(t *testing.T) {
	p, err := outbox.NewProducer(outbox.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	h := map[string]string{"tenant": "t-1"}
	allocs := testing.AllocsPerRun(100, func() {
		if got := outbox.TraceHeaders(p, ctx, h); len(got) != 1 {
			t.Fatal(got)
		}
	})
	require.Zero(t, allocs)
	// A context with a span context that is not valid is no span.
	require.Nil(t, outbox.TraceHeaders(p, trace.ContextWithSpanContext(ctx, trace.SpanContext{}), nil))
}

// BenchmarkTraceInjection is the cost Emit adds per event for the trace
// context: none without a span, one traceparent (and tracestate) with one.
func BenchmarkTraceInjection(b *testing.B) {
	p, err := outbox.NewProducer(outbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	traced := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	h := map[string]string{"tenant": "t-1"}
	for _, bc := range []struct {
		name string
		ctx  context.Context
	}{{"no-span", context.Background()}, {"span", traced}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = outbox.TraceHeaders(p, bc.ctx, h)
			}
		})
	}
}
