package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

// orderUpcasters turns order.placed v1 {"total": 19.99} into v2
// {"total_cents": 1999} and v2 into v3, which adds "currency".
func orderUpcasters(t *testing.T) *consumer.Upcasters {
	t.Helper()
	ups := &consumer.Upcasters{}
	require.NoError(t, ups.Register("t.placed", 1, func(p json.RawMessage) (json.RawMessage, error) {
		var v1 struct {
			Total *float64 `json:"total"`
		}
		if err := json.Unmarshal(p, &v1); err != nil {
			return nil, err
		}
		if v1.Total == nil {
			return nil, errors.New("v1 payload has no total")
		}
		return json.Marshal(map[string]any{"total_cents": int64(*v1.Total*100 + 0.5)})
	}))
	require.NoError(t, ups.Register("t.placed", 2, func(p json.RawMessage) (json.RawMessage, error) {
		var v map[string]any
		if err := json.Unmarshal(p, &v); err != nil {
			return nil, err
		}
		v["currency"] = "EUR"
		return json.Marshal(v)
	}))
	return ups
}

// startRelay publishes the bundle's outbox rows to its broker until the
// test ends.
func startRelay(t *testing.T, b *bundle) {
	t.Helper()
	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{b.broker.Addr()}, Opts: kafkaOpts()})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	r, err := relay.New(relay.Config{
		Common:       relay.Common{Pool: b.db.Pool, Tables: b.db.Tables, Sink: kafkapub.NewPublisher(client, kafkapub.PublisherConfig{}), Logger: slog.New(slog.DiscardHandler)},
		PollInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})
}

// applied is what a handler saw: one row per consumer and event.
func (b *bundle) createApplied(t *testing.T) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), `CREATE TABLE applied (consumer TEXT NOT NULL, event_id BIGINT NOT NULL, version INT NOT NULL, payload JSONB NOT NULL, original JSONB, PRIMARY KEY (consumer, event_id))`)
	require.NoError(t, err)
}

// applyAs records ev as applied by consumer name; applying an event twice
// fails on the primary key.
func applyAs(name string) consumer.Handler {
	return func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		var orig *string
		if ev.OriginalPayload != nil {
			s := string(ev.OriginalPayload)
			orig = &s
		}
		_, err := tx.Exec(ctx, `INSERT INTO applied (consumer, event_id, version, payload, original) VALUES ($1, $2, $3, $4, $5)`,
			name, ev.ID, ev.Version, string(ev.Payload), orig)
		return err
	}
}

type appliedRow struct {
	Version           int
	Payload, Original string
}

// appliedBy returns what consumer name applied, by event id.
func (b *bundle) appliedBy(t *testing.T, name string) map[int64]appliedRow {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT event_id, version, payload::text, coalesce(original::text, '') FROM applied WHERE consumer = $1`, name)
	require.NoError(t, err)
	out := map[int64]appliedRow{}
	var (
		id int64
		r  appliedRow
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &r.Version, &r.Payload, &r.Original}, func() error {
		out[id] = r
		return nil
	})
	require.NoError(t, err)
	return out
}

// Events emitted as v1, v2, v3 and without a version reach a handler that
// reads v3 all as v3, upcast step by step, through the relayer and Kafka.
// An event newer than the handler, a missing step and a failing step are
// dead-lettered at once with a reason that says what to do, and the
// events after them are processed.
func TestUpcastEndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createApplied(t)
	ctx := context.Background()
	ups := orderUpcasters(t)
	require.NoError(t, ups.Register("t.refunded", 1, func(json.RawMessage) (json.RawMessage, error) {
		return nil, errors.New("refunds before 2024 have no currency")
	}))

	p, err := outbox.NewProducer(outbox.Config{Tables: b.db.Tables})
	require.NoError(t, err)
	agg := uuid.New()
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		for _, ev := range []outbox.Event{
			{Type: "t.placed", Version: 1, Payload: json.RawMessage(`{"total": 19.99}`)},
			{Type: "t.placed", Version: 2, Payload: json.RawMessage(`{"total_cents": 500}`)},
			{Type: "t.placed", Version: 3, Payload: json.RawMessage(`{"total_cents": 700, "currency": "USD"}`)},
			{Type: "t.placed", Payload: json.RawMessage(`{"total": 1}`)}, // no version: read as 1
			{Type: "t.placed", Version: 4, Payload: json.RawMessage(`{}`)},
			{Type: "t.shipped", Version: 1, Payload: json.RawMessage(`{}`)},
			{Type: "t.refunded", Version: 1, Payload: json.RawMessage(`{}`)},
			{Type: "t.placed", Version: 1, Payload: json.RawMessage(`{"total": 2.5}`)},
		} {
			ev.AggregateID = agg
			id, err := p.Emit(ctx, tx, ev)
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	}))
	startRelay(t, b)

	cfg := b.config(map[string]consumer.Handler{
		"t.placed":   applyAs("c"),
		"t.shipped":  applyAs("c"),
		"t.refunded": applyAs("c"),
	})
	cfg.Middleware = []consumer.Middleware{ups.Want("t.placed", 3), ups.Want("t.shipped", 2), ups.Want("t.refunded", 2)}
	c, err := consumer.New(cfg)
	require.NoError(t, err)
	run(t, c)

	dlq := b.read(t, "t.dlq", 3, 30*time.Second)
	require.Len(t, dlq, 3)
	reasons := map[string]string{}
	for _, r := range dlq {
		h := headers(r)
		require.Equal(t, "1", h[consumer.HeaderDLQAttempts], "a permanent error is not retried")
		reasons[h[outbox.HeaderEventID]] = h[consumer.HeaderDLQError]
	}
	id := func(i int) string { return strconv.FormatInt(ids[i], 10) }
	require.Contains(t, reasons[id(4)], fmt.Sprintf(`event %d of type "t.placed" is version 4, newer than version 3, which this handler reads; deploy a consumer that reads version 4, or have the producer emit version 3 beside it (outbox.EmitVersions)`, ids[4]))
	require.Contains(t, reasons[id(5)], fmt.Sprintf(`event %d of type "t.shipped" is version 1, and there is no upcaster from version 1 to 2 to read it as version 2; register one (Upcasters.Register("t.shipped", 1, fn))`, ids[5]))
	require.Contains(t, reasons[id(6)], fmt.Sprintf(`upcast event %d of type "t.refunded" from version 1 to 2: refunds before 2024 have no currency; fix the upcaster`, ids[6]))

	require.Eventually(t, func() bool { return len(b.appliedBy(t, "c")) == 5 }, 20*time.Second, 20*time.Millisecond)
	got := b.appliedBy(t, "c")
	require.Equal(t, map[int64]appliedRow{
		ids[0]: {3, `{"currency": "EUR", "total_cents": 1999}`, `{"total": 19.99}`},
		ids[1]: {3, `{"currency": "EUR", "total_cents": 500}`, `{"total_cents": 500}`},
		ids[2]: {3, `{"currency": "USD", "total_cents": 700}`, ""},
		ids[3]: {3, `{"currency": "EUR", "total_cents": 100}`, `{"total": 1}`},
		ids[7]: {3, `{"currency": "EUR", "total_cents": 250}`, `{"total": 2.5}`},
	}, got)
	require.Equal(t, 5, b.processedRows(t), "dead-lettered events are not recorded as processed")
}

// A logical event dual-emitted as v1 and v2 is applied once by a consumer
// that reads v1 (from the v1 row), once by one that reads v2 (from the v2
// row), once by one that reads v3 (the v2 row, upcast), and twice by a
// consumer that reads every row. Each records every row as processed.
func TestDualEmitEndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createApplied(t)
	ctx := context.Background()
	ups := orderUpcasters(t)

	p, err := outbox.NewProducer(outbox.Config{Tables: b.db.Tables})
	require.NoError(t, err)
	var rows [][]int64
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		for i := range 3 {
			ids, err := p.EmitVersions(ctx, tx, outbox.Event{AggregateID: uuid.New(), Type: "t.placed"},
				outbox.VersionedPayload{Version: 1, Payload: map[string]any{"total": float64(i) + 0.5}},
				outbox.VersionedPayload{Version: 2, Payload: map[string]any{"total_cents": i*100 + 50}},
			)
			if err != nil {
				return err
			}
			rows = append(rows, ids)
		}
		return nil
	}))
	startRelay(t, b)

	consumers := map[string]int{"v1": 1, "v2": 2, "v3": 3, "all": 0}
	var cs []*consumer.Consumer
	for name, want := range consumers {
		cfg := b.config(map[string]consumer.Handler{"t.placed": applyAs(name)})
		cfg.Name = name
		if want > 0 {
			cfg.Middleware = []consumer.Middleware{ups.Want("t.placed", want)}
		}
		c, err := consumer.New(cfg)
		require.NoError(t, err)
		run(t, c)
		cs = append(cs, c)
	}
	require.Eventually(t, func() bool {
		return b.count(t, "SELECT count(*) FROM "+b.db.Tables.ProcessedIdent()) == 4*6
	}, 30*time.Second, 20*time.Millisecond, "every consumer records every row")
	for _, c := range cs {
		st := c.Stats()
		require.Zero(t, st.DeadLettered)
		require.EqualValues(t, 6, st.Processed)
	}

	pick := func(name string, version, col int, payload func(i int) string, original func(i int) string) {
		t.Helper()
		want := map[int64]appliedRow{}
		for i, ids := range rows {
			want[ids[col]] = appliedRow{version, payload(i), original(i)}
		}
		require.Equal(t, want, b.appliedBy(t, name), name)
	}
	none := func(int) string { return "" }
	v1 := func(i int) string { return fmt.Sprintf(`{"total": %d.5}`, i) }
	v2 := func(i int) string { return fmt.Sprintf(`{"total_cents": %d}`, i*100+50) }
	pick("v1", 1, 0, v1, none)
	pick("v2", 2, 1, v2, none)
	pick("v3", 3, 1, func(i int) string { return fmt.Sprintf(`{"currency": "EUR", "total_cents": %d}`, i*100+50) }, v2)
	all := b.appliedBy(t, "all")
	require.Len(t, all, 6, "a consumer without versions sees each version's row")
	for _, ids := range rows {
		require.Equal(t, 1, all[ids[0]].Version)
		require.Equal(t, 2, all[ids[1]].Version)
	}
}

// The Dispatcher every other transport (NATS, RabbitMQ, Redis Streams,
// webhooks) is built on reads the version and upcasts the same way, and
// a skipped row of a dual emit is Done and recorded.
func TestDispatchUpcasts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := dbOnly(t)
	var seen []consumer.Event
	ups := orderUpcasters(t)
	d := b.dispatcher(t, consumer.DispatcherConfig{
		Handlers: map[string]consumer.Handler{"t.placed": ups.Want("t.placed", 2)(func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
			seen = append(seen, ev)
			return nil
		})},
	})
	res := d.Dispatch(ctx, ctx, delivery("1", "t.placed", `{"total": 3}`, outbox.HeaderEventVersion, "1"))
	require.Equal(t, consumer.Done, res.Verdict, res.Reason)
	require.Equal(t, 1, res.Event.Version, "the result keeps the event as delivered")
	require.Len(t, seen, 1)
	require.Equal(t, 2, seen[0].Version)
	require.JSONEq(t, `{"total_cents": 300}`, string(seen[0].Payload))
	require.Equal(t, `{"total": 3}`, string(seen[0].OriginalPayload))

	res = d.Dispatch(ctx, ctx, delivery("2", "t.placed", `{"total": 3}`, outbox.HeaderEventVersion, "1", outbox.HeaderEventVersions, "1,2"))
	require.Equal(t, consumer.Done, res.Verdict, res.Reason)
	require.Equal(t, consumer.Processed, res.Outcome, "a skipped row is recorded")
	require.Len(t, seen, 1, "the v1 row of a 1,2 dual emit is skipped")
	res = d.Dispatch(ctx, ctx, delivery("2", "t.placed", `{"total": 3}`, outbox.HeaderEventVersion, "1", outbox.HeaderEventVersions, "1,2"))
	require.Equal(t, consumer.Duplicate, res.Outcome)

	res = d.Dispatch(ctx, ctx, delivery("3", "t.placed", `{}`, outbox.HeaderEventVersion, "3"))
	require.Equal(t, consumer.DeadLetter, res.Verdict)
	require.Equal(t, 1, res.Attempts)
	require.Contains(t, res.Reason, "is version 3, newer than version 2")
}

// The middleware's refusals, on events that need no database.
func TestWantRefuses(t *testing.T) {
	t.Parallel()
	ups := orderUpcasters(t)
	require.NoError(t, ups.Register("t.bad", 1, func(json.RawMessage) (json.RawMessage, error) { return json.RawMessage(`{"a":`), nil }))
	require.NoError(t, ups.Register("t.mutating", 1, func(p json.RawMessage) (json.RawMessage, error) {
		p[0] = '['
		return json.RawMessage(`{}`), nil
	}))
	var got []consumer.Event
	h := consumer.Chain(func(_ context.Context, _ pgx.Tx, ev consumer.Event) error {
		got = append(got, ev)
		return nil
	}, ups.Want("t.placed", 2), ups.Want("t.bad", 2), ups.Want("t.mutating", 2))
	call := func(typ, payload string, hdr ...string) error {
		ev := consumer.Event{ID: 9, Type: typ, Payload: []byte(payload), Headers: map[string]string{}}
		for i := 0; i+1 < len(hdr); i += 2 {
			ev.Headers[hdr[i]] = hdr[i+1]
		}
		return h(context.Background(), nil, ev)
	}
	for name, tc := range map[string]struct {
		typ, payload string
		hdr          []string
		says         string
	}{
		"version not a number":  {"t.placed", `{}`, []string{outbox.HeaderEventVersion, "v2"}, `event_version header "v2" is not a positive decimal integer; the producer must write`},
		"version zero":          {"t.placed", `{}`, []string{outbox.HeaderEventVersion, "0"}, `event_version header "0"`},
		"version signed":        {"t.placed", `{}`, []string{outbox.HeaderEventVersion, "+2"}, `event_version header "+2"`},
		"version huge":          {"t.placed", `{}`, []string{outbox.HeaderEventVersion, "99999999999"}, `event_version header "99999999999"`},
		"versions not listed":   {"t.placed", `{}`, []string{outbox.HeaderEventVersion, "2", outbox.HeaderEventVersions, "1,3"}, `does not list the event's own version 2`},
		"versions descending":   {"t.placed", `{}`, []string{outbox.HeaderEventVersion, "2", outbox.HeaderEventVersions, "2,1"}, `is not ascending`},
		"versions empty member": {"t.placed", `{}`, []string{outbox.HeaderEventVersion, "2", outbox.HeaderEventVersions, "1,,2"}, `holds "", not a positive decimal integer`},
		"versions spaces":       {"t.placed", `{}`, []string{outbox.HeaderEventVersion, "2", outbox.HeaderEventVersions, "1, 2"}, `holds " 2"`},
		"upcaster bad json":     {"t.bad", `{}`, []string{outbox.HeaderEventVersion, "1"}, `returned 5 bytes that are not valid JSON`},
		"upcaster fails":        {"t.placed", `{"price": 3}`, []string{outbox.HeaderEventVersion, "1"}, `upcast event 9 of type "t.placed" from version 1 to 2: v1 payload has no total`},
	} {
		err := call(tc.typ, tc.payload, tc.hdr...)
		require.True(t, consumer.IsPermanent(err), "%s: %v", name, err)
		require.ErrorContains(t, err, tc.says, name)
	}
	require.Empty(t, got)

	// The original payload is safe from an upcaster that writes to its
	// argument.
	require.NoError(t, call("t.mutating", `{"x":1}`))
	require.Equal(t, `{"x":1}`, string(got[0].OriginalPayload))

	// Other types pass untouched, Version as decoded.
	require.NoError(t, call("t.other", `{"total": 1}`, outbox.HeaderEventVersion, "1"))
	require.Equal(t, `{"total": 1}`, string(got[1].Payload))
	require.Nil(t, got[1].OriginalPayload)

	// Which row of a dual emit a handler applies: its version, else the
	// highest listed below it, else the lowest listed.
	for _, tc := range []struct {
		want  int
		list  string
		apply int
	}{{2, "1,2", 2}, {1, "1,2", 1}, {3, "1,2", 2}, {2, "1,3", 1}, {1, "2,3", 2}, {2, "2", 2}} {
		ups := &consumer.Upcasters{}
		for v := 1; v < 4; v++ {
			require.NoError(t, ups.Register("t.x", v, func(p json.RawMessage) (json.RawMessage, error) { return p, nil }))
		}
		var applied []string
		h := ups.Want("t.x", tc.want)(func(_ context.Context, _ pgx.Tx, ev consumer.Event) error {
			applied = append(applied, ev.Headers[outbox.HeaderEventVersion])
			return nil
		})
		var tooNew error
		for _, own := range strings.Split(tc.list, ",") {
			err := h(context.Background(), nil, consumer.Event{ID: 1, Type: "t.x", Payload: []byte(`{}`),
				Headers: map[string]string{outbox.HeaderEventVersion: own, outbox.HeaderEventVersions: tc.list}})
			if err != nil {
				require.Nil(t, tooNew)
				tooNew = err
				applied = append(applied, own)
			}
		}
		require.Equal(t, []string{strconv.Itoa(tc.apply)}, applied, "want %d of %s", tc.want, tc.list)
		require.Equal(t, tc.apply > tc.want, tooNew != nil, "want %d of %s: %v", tc.want, tc.list, tooNew)
	}
}

func TestUpcastersRegister(t *testing.T) {
	t.Parallel()
	id := func(p json.RawMessage) (json.RawMessage, error) { return p, nil }
	ups := &consumer.Upcasters{}
	require.NoError(t, ups.Register("t.placed", 1, id))
	require.ErrorContains(t, ups.Register("t.placed", 1, id), "a step from version 1 to 2 is already registered")
	require.ErrorContains(t, ups.Register("t.placed", 0, id), "versions start at 1")
	require.ErrorContains(t, ups.Register("", 1, id), "the event type is empty")
	require.ErrorContains(t, ups.Register("t.placed", 2, nil), "the upcaster is nil")
	require.PanicsWithValue(t, `consumer: Upcasters.Want("t.placed", 0): versions start at 1`, func() { ups.Want("t.placed", 0) })

	// A nil *Upcasters has no steps: it only picks rows and checks
	// versions.
	var none *consumer.Upcasters
	err := none.Want("t.placed", 2)(func(context.Context, pgx.Tx, consumer.Event) error { return nil })(context.Background(), nil,
		consumer.Event{ID: 1, Type: "t.placed", Payload: []byte(`{}`), Headers: map[string]string{}})
	require.ErrorContains(t, err, "is version 1, and there is no upcaster from version 1 to 2")
}
