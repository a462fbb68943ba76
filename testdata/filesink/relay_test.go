package filesink_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/walrelay"

	"example.com/filesink"
)

// LogicalURLEnv names the variable that gives the WAL test a server with
// wal_level=logical (the outbox module's test starts one and sets it).
const LogicalURLEnv = "FILESINK_LOGICAL_URL"

const (
	events     = 300
	aggregates = 12
)

// The polling relay relays every event emitted with Emit into the files,
// each aggregate in order, none lost.
func TestPollingRelay(t *testing.T) {
	t.Parallel()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	sink := newSink(t)
	o := newOutbox(t, url, sink)
	r, err := relay.New(relay.Config{Common: relay.Common{Pool: o.pool, Sink: sink, Tables: o.tables}, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	o.relay(t, sink, r.Run)
}

// The WAL source relays every event emitted with Emit into the files,
// each aggregate in order, none lost.
func TestWALRelay(t *testing.T) {
	t.Parallel()
	url := os.Getenv(LogicalURLEnv)
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set: the WAL test needs a server with wal_level=logical (run it through the outbox module's TestOutOfTreeSink, which starts one)", LogicalURLEnv)
		}
		t.Skipf("skipped: %s is not set; the WAL test needs a server with wal_level=logical (the outbox module's TestOutOfTreeSink starts one and sets it)", LogicalURLEnv)
	}
	sink := newSink(t)
	o := newOutbox(t, url, sink)
	slot := walrelay.DefaultNameOf(o.pool, o.tables)
	ctx := context.Background()
	// The slot exists before the first event: what is committed before it
	// is not in it.
	if err := walrelay.Setup(ctx, o.pool, o.tables, slot, slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Runs after the relayer stopped (cleanups run in reverse); the
		// slot may still be releasing.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for {
			err := walrelay.Teardown(ctx, o.pool, slot, slot)
			if err == nil || ctx.Err() != nil {
				if err != nil {
					t.Errorf("teardown of slot %s: %v", slot, err)
				}
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	r, err := walrelay.New(walrelay.Config{Common: relay.Common{Pool: o.pool, Sink: sink, Tables: o.tables}, Slot: slot, Publication: slot,
		StatusInterval: 200 * time.Millisecond, LeaderPollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	o.relay(t, sink, r.Run)
}

func newSink(t *testing.T) *filesink.Sink {
	t.Helper()
	sink, err := filesink.New(filesink.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return sink
}

// testOutbox is an outbox in a schema of its own, dropped when the test
// ends.
type testOutbox struct {
	pool     *pgxpool.Pool
	tables   outbox.Tables
	producer *outbox.Producer
}

// newOutbox's producer routes with sink's routing, as producers that
// write for a sink do.
func newOutbox(t *testing.T, url string, sink *filesink.Sink) *testOutbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "filesink_" + hex.EncodeToString(b[:])
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatalf("create schema on %s (is Postgres running? set DATABASE_URL): %v", url, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			t.Logf("drop schema %s: %v", schema, err)
		}
	})
	tables := outbox.Tables{Schema: schema}.WithDefaults()
	m, err := migrate.New(tables)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx, pool); err != nil {
		t.Fatal(err)
	}
	routing, err := sink.Routing("")
	if err != nil {
		t.Fatal(err)
	}
	p, err := outbox.NewProducer(outbox.Config{Tables: tables, Routing: routing})
	if err != nil {
		t.Fatal(err)
	}
	return &testOutbox{pool: pool, tables: tables, producer: p}
}

// emitted is one committed event: its aggregate and its payload's n.
type emitted struct {
	agg uuid.UUID
	n   int
}

// emit commits events n = from..to-1 on aggs, round-robin, in transactions
// of up to 10, with Emit; orders.* and invoices.* alternate by aggregate,
// so two destinations are written.
func (o *testOutbox) emit(t *testing.T, aggs []uuid.UUID, from, to int, into map[int64]emitted) {
	t.Helper()
	ctx := context.Background()
	for start := from; start < to; start += 10 {
		err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
			for n := start; n < min(start+10, to); n++ {
				a := n % len(aggs)
				typ := "orders.updated"
				if a%2 == 1 {
					typ = "invoices.updated"
				}
				id, err := o.producer.Emit(ctx, tx, outbox.Event{AggregateID: aggs[a], Type: typ,
					Payload: map[string]any{"n": n, "note": "Grüße"}, Headers: map[string]string{"n": fmt.Sprint(n)}})
				if err != nil {
					return err
				}
				into[id] = emitted{agg: aggs[a], n: n}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// relay emits half the events, starts run, emits the rest while it runs,
// and checks the files once every event is in them.
func (o *testOutbox) relay(t *testing.T, sink *filesink.Sink, run func(context.Context) error) {
	t.Helper()
	aggs := make([]uuid.UUID, aggregates)
	for i := range aggs {
		aggs[i] = uuid.New()
	}
	want := map[int64]emitted{}
	o.emit(t, aggs, 0, events/2, want)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("relayer Run returned %v; want nil on stop", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("relayer did not stop within 30s")
		}
	}
	t.Cleanup(stop)
	o.emit(t, aggs, events/2, events, want)

	var lines []filesink.Line
	deadline := time.Now().Add(60 * time.Second)
	for {
		lines = nil
		for _, dest := range []string{"orders", "invoices"} {
			l, err := sink.Read(dest)
			if err != nil {
				t.Fatal(err)
			}
			lines = append(lines, l...)
		}
		seen := map[int64]bool{}
		for _, l := range lines {
			seen[l.ID] = true
		}
		if len(seen) >= len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events reached the files within 60s", len(seen), len(want))
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	check(t, want, lines)
}

// check asserts that lines hold every event of want, nothing else, with
// its aggregate and payload, and each aggregate's first deliveries in
// emit order.
func check(t *testing.T, want map[int64]emitted, lines []filesink.Line) {
	t.Helper()
	last := map[string]int{}
	seen := map[int64]bool{}
	for _, l := range lines {
		ev, ok := want[l.ID]
		if !ok {
			t.Fatalf("event %d reached the files but was never emitted", l.ID)
		}
		if l.AggregateID != ev.agg.String() {
			t.Errorf("event %d: aggregate %s, want %s", l.ID, l.AggregateID, ev.agg)
		}
		var p struct{ N int }
		if err := json.Unmarshal([]byte(l.Payload), &p); err != nil || p.N != ev.n {
			t.Errorf("event %d: payload %s, want n=%d (%v)", l.ID, l.Payload, ev.n, err)
		}
		if l.Headers["n"] != fmt.Sprint(ev.n) {
			t.Errorf("event %d: header n=%q, want %d", l.ID, l.Headers["n"], ev.n)
		}
		if seen[l.ID] {
			continue
		}
		seen[l.ID] = true
		if prev, ok := last[l.AggregateID]; ok && ev.n < prev {
			t.Errorf("aggregate %s: event n=%d first arrived after n=%d", l.AggregateID, ev.n, prev)
		}
		last[l.AggregateID] = max(last[l.AggregateID], ev.n)
	}
	if len(seen) != len(want) {
		t.Errorf("%d of %d events reached the files", len(seen), len(want))
	}
}
