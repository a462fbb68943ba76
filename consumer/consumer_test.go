package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/internal/commithook"
	"github.com/pgoutbox/outbox/kafka"
)

// Must-show 3: each malformed record and each record whose handler keeps
// failing lands in the dead-letter topic with the documented headers, and
// the records after it are processed.
func TestConsumerDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var failCalls, panicCalls atomic.Int64
	cfg := b.config(map[string]consumer.Handler{
		"item.ok": record,
		"item.fail": func(context.Context, pgx.Tx, consumer.Event) error {
			failCalls.Add(1)
			return errors.New("payment service says no")
		},
		"item.panic": func(context.Context, pgx.Tx, consumer.Event) error {
			panicCalls.Add(1)
			panic("handler bug")
		},
		"item.typed": consumer.Typed(func(context.Context, pgx.Tx, consumer.Event, struct{ N int }) error { return nil }),
	})
	cfg.MaxAttempts = 3
	c, err := consumer.New(cfg)
	require.NoError(t, err)

	noID := event("t", 0, 2, "item.ok", `{}`)
	noID.Headers = noID.Headers[1:]
	// rawID is a record whose (first) event_id header is raw.
	rawID := func(raw string) *kgo.Record {
		r := event("t", 0, 1, "item.ok", `{}`)
		r.Headers[0].Value = []byte(raw)
		return r
	}
	recs := []*kgo.Record{
		event("t", 0, 1, "item.ok", `{"n":1}`),
		noID,
		rawID("abc"),
		event("t", 0, 0, "item.ok", `{}`),
		event("t", 0, -5, "item.ok", `{}`),
		rawID(""),
		event("t", 0, 7, "item.ok", `not json`, "trace", "abc123"),
		event("t", 0, 8, "item.unknown", `{}`),
		event("t", 0, 9, "item.fail", `{}`),
		event("t", 0, 10, "item.panic", `{}`),
		event("t", 0, 11, "item.typed", `{"N":"not a number"}`),
		event("t", 0, 12, "item.ok", `{"n":12}`),
	}
	produce(t, b.producer(t), recs...)
	stop := run(t, c)

	type want struct {
		attempts int
		reason   string
	}
	wants := []want{
		{0, "no event_id header"},
		{0, `event_id header "abc" is not a positive decimal integer`},
		{0, `event_id header "0" is not a positive decimal integer`},
		{0, `event_id header "-5" is not a positive decimal integer`},
		{0, `event_id header "" is not a positive decimal integer`},
		{0, "payload of 8 bytes is not valid JSON"},
		{0, `no handler for event type "item.unknown" and no default handler`},
		{3, "payment service says no"},
		{3, "handler panicked: handler bug"},
		{1, `decode "item.typed" payload into struct { N int }`},
	}
	dlq := b.read(t, "t.dlq", len(wants), 20*time.Second)
	require.Len(t, dlq, len(wants))
	for i, r := range dlq {
		orig := recs[i+1]
		h := headers(r)
		require.Equal(t, string(orig.Key), string(r.Key), "dead letter %d", i)
		require.Equal(t, string(orig.Value), string(r.Value), "dead letter %d", i)
		for k, v := range headers(orig) {
			require.Equal(t, v, h[k], "dead letter %d keeps header %s", i, k)
		}
		require.Contains(t, h[consumer.HeaderDLQError], wants[i].reason, "dead letter %d", i)
		require.Equal(t, strconv.Itoa(wants[i].attempts), h[consumer.HeaderDLQAttempts], "dead letter %d", i)
		require.Equal(t, "test", h[consumer.HeaderDLQConsumer])
		require.Equal(t, "t", h[consumer.HeaderDLQOriginalTopic])
		require.Equal(t, "0", h[consumer.HeaderDLQOriginalPartition])
		require.Equal(t, strconv.Itoa(i+1), h[consumer.HeaderDLQOriginalOffset])
	}
	require.Equal(t, "abc123", headers(dlq[5])["trace"])

	// The record after them all was processed.
	require.Eventually(t, func() bool { return len(b.effects(t)) == 2 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, map[string]int{"/1": 1, "/12": 1}, b.effects(t))
	require.EqualValues(t, 3, failCalls.Load(), "dlq_attempts counts every call, the one in the failed batch included")
	require.EqualValues(t, 3, panicCalls.Load())
	wantStats := consumer.Stats{Records: 12, Processed: 2, DeadLettered: 10, Malformed: 7, Retries: 4}
	require.Eventually(t, func() bool { return c.Stats() == wantStats }, 10*time.Second, 10*time.Millisecond, "stats: %+v", c.Stats())
	// Dead-lettered events are not recorded as processed: replayed after a
	// fix, they are processed.
	require.Equal(t, 2, b.processedRows(t))
	require.NoError(t, stop())

	// The offsets were committed past the dead letters: a new member of the
	// group starts after them.
	c2, err := consumer.New(cfg)
	require.NoError(t, err)
	run(t, c2)
	produce(t, b.producer(t), event("t", 0, 13, "item.ok", `{}`))
	require.Eventually(t, func() bool { return len(b.effects(t)) == 3 }, 20*time.Second, 20*time.Millisecond)
	// The effect commits before the consumer counts it.
	wantC2 := consumer.Stats{Records: 1, Processed: 1}
	require.Eventually(t, func() bool { return c2.Stats() == wantC2 }, 10*time.Second, 10*time.Millisecond, "stats: %+v", c2.Stats())
}

// Offsets move past a dead-lettered record only once the broker has
// acknowledged its dead-letter copy: while the dead-letter topic refuses
// writes, the partition waits at that record.
func TestConsumerDeadLetterWaitsForAcknowledgement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var commits []int64
	cfg := b.config(map[string]consumer.Handler{"item.ok": record})
	hook := commithook.Func(func(offsets map[string]map[int32]int64) error {
		mu.Lock()
		defer mu.Unlock()
		if o, ok := offsets["t"][0]; ok {
			commits = append(commits, o)
		}
		return nil
	})
	c, err := consumer.New(cfg)
	require.NoError(t, err)
	// Auto-create the dead-letter topic first: the fault is on produce.
	produce(t, b.producer(t), event("t.dlq", 0, 1, "x", `{}`))
	fault := b.broker.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "t.dlq", Err: kerr.TopicAuthorizationFailed, Count: -1})
	produce(t, b.producer(t),
		event("t", 0, 1, "item.ok", `{}`),
		event("t", 0, 2, "item.ok", `not json`),
		event("t", 0, 3, "item.ok", `{}`),
	)
	runCtx(t, commithook.With(context.Background(), hook), c)
	require.Eventually(t, func() bool { return len(b.effects(t)) == 1 }, 20*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return fault.Hits() >= 3 }, 10*time.Second, 10*time.Millisecond, "the dead-letter write is retried")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(commits) > 0
	}, 10*time.Second, 10*time.Millisecond, "the record before the stuck one is committed while it waits")
	mu.Lock()
	seen := slices.Clone(commits)
	mu.Unlock()
	for _, o := range seen {
		require.EqualValues(t, 1, o, "committed past a record whose dead letter was not acknowledged")
	}
	require.Equal(t, map[string]int{"/1": 1}, b.effects(t), "the record after the unacknowledged one was processed")

	fault.Remove()
	require.Eventually(t, func() bool { return len(b.effects(t)) == 2 }, 20*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return commits[len(commits)-1] == 3
	}, 10*time.Second, 10*time.Millisecond)
	// Two records: the one that created the topic, and the dead letter;
	// read from all partitions, so in no particular order.
	dlq := b.read(t, "t.dlq", 2, 10*time.Second)
	values := []string{string(dlq[0].Value), string(dlq[1].Value)}
	slices.Sort(values)
	require.Equal(t, []string{"not json", "{}"}, values)
	require.Eventually(t, func() bool { return c.Stats().DeadLettered == 1 }, 5*time.Second, 10*time.Millisecond)
}

func TestConsumerRoutesEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	type placed struct {
		OrderID string `json:"order_id"`
		Total   int64  `json:"total"`
	}
	var mu sync.Mutex
	var typed []placed
	var got []consumer.Event
	seen := func(ev consumer.Event) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, ev)
	}
	cfg := b.config(map[string]consumer.Handler{
		"order.placed": consumer.Typed(func(ctx context.Context, tx pgx.Tx, ev consumer.Event, p placed) error {
			mu.Lock()
			typed = append(typed, p)
			mu.Unlock()
			seen(ev)
			return record(ctx, tx, ev)
		}),
	})
	cfg.Topics = []string{"order", "invoice"}
	cfg.DefaultHandler = func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		seen(ev)
		return record(ctx, tx, ev)
	}
	var wrapped atomic.Int64
	cfg.Middleware = []consumer.Middleware{func(next consumer.Handler) consumer.Handler {
		return func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
			wrapped.Add(1)
			return next(ctx, tx, ev)
		}
	}}
	c, err := consumer.New(cfg)
	require.NoError(t, err)
	agg := uuid.MustParse("0b6f9f0e-5a64-4e39-9d0e-6b8a6f7b1c2d")
	produce(t, b.producer(t),
		event("order", 1, 1, "order.placed", `{"order_id":"o-1","total":1250,"extra":true}`, outbox.HeaderEventSource, "shop-eu", "traceparent", "00-abc"),
		event("invoice", 0, 2, "invoice.sent", `{"n":2}`),
	)
	run(t, c)
	require.Eventually(t, func() bool { return len(b.effects(t)) == 2 }, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, map[string]int{"shop-eu/1": 1, "/2": 1}, b.effects(t))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []placed{{OrderID: "o-1", Total: 1250}}, typed)
	require.Len(t, got, 2)
	byID := map[int64]consumer.Event{}
	for _, ev := range got {
		byID[ev.ID] = ev
	}
	ev := byID[1]
	require.Equal(t, "shop-eu", ev.Source)
	require.Equal(t, "order.placed", ev.Type)
	require.Equal(t, agg, ev.AggregateID)
	require.Equal(t, "order", ev.Topic)
	require.EqualValues(t, 1, ev.Partition)
	require.EqualValues(t, 0, ev.Offset)
	require.Equal(t, "00-abc", ev.Headers["traceparent"])
	require.JSONEq(t, `{"order_id":"o-1","total":1250,"extra":true}`, string(ev.Payload))
	require.Equal(t, "", byID[2].Source)
	require.Equal(t, "invoice.sent", byID[2].Type)
	require.EqualValues(t, 2, wrapped.Load())
}

// The same event_id from two outboxes is two events; the same one from the
// same outbox twice is one.
func TestConsumerSourceDimension(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := consumer.New(b.config(map[string]consumer.Handler{"item.ok": record}))
	require.NoError(t, err)
	produce(t, b.producer(t),
		event("t", 0, 5, "item.ok", `{}`, outbox.HeaderEventSource, "db-a"),
		event("t", 1, 5, "item.ok", `{}`, outbox.HeaderEventSource, "db-b"),
		event("t", 2, 5, "item.ok", `{}`),
		event("t", 0, 5, "item.ok", `{}`, outbox.HeaderEventSource, "db-a"),
		event("t", 2, 5, "item.ok", `{}`),
	)
	run(t, c)
	require.Eventually(t, func() bool { return c.Stats().Records == 5 }, 20*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return c.Stats().Processed+c.Stats().Duplicates == 5 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, map[string]int{"db-a/5": 1, "db-b/5": 1, "/5": 1}, b.effects(t))
	require.EqualValues(t, 2, c.Stats().Duplicates)
}

// A handler that fails inside a batch sends the batch one by one: the
// others commit once, the failing one is retried alone.
func TestConsumerBatchFallsBackOneByOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls sync.Map
	cfg := b.config(map[string]consumer.Handler{"item.ok": func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		n, _ := calls.LoadOrStore(ev.ID, new(atomic.Int64))
		if n.(*atomic.Int64).Add(1) <= 2 && ev.ID == 15 {
			return errors.New("flaky")
		}
		return record(ctx, tx, ev)
	}})
	cfg.BatchSize = 8
	c, err := consumer.New(cfg)
	require.NoError(t, err)
	var recs []*kgo.Record
	for id := int64(1); id <= 40; id++ {
		recs = append(recs, event("t", 0, id, "item.ok", `{}`))
	}
	produce(t, b.producer(t), recs...)
	run(t, c)
	require.Eventually(t, func() bool { return len(b.effects(t)) == 40 }, 20*time.Second, 20*time.Millisecond)
	for k, n := range b.effects(t) {
		require.Equal(t, 1, n, "event %s applied %d times", k, n)
	}
	st := c.Stats()
	require.EqualValues(t, 40, st.Processed)
	require.EqualValues(t, 2, st.Retries, "the failure in the batch is the first attempt; one by one it fails once more, then succeeds")
	require.Zero(t, st.DeadLettered)
}

// A transaction that outlives ShutdownTimeout is rolled back and its record
// is not committed: the next run processes it.
func TestConsumerShutdownAbandonsStuckTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	entered := make(chan struct{}, 1)
	cfg := b.config(map[string]consumer.Handler{"item.ok": func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		if err := record(ctx, tx, ev); err != nil {
			return err
		}
		select {
		case entered <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}})
	cfg.ShutdownTimeout = 200 * time.Millisecond
	c, err := consumer.New(cfg)
	require.NoError(t, err)
	produce(t, b.producer(t), event("t", 0, 1, "item.ok", `{}`))
	stop := run(t, c)
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("handler never ran")
	}
	start := time.Now()
	require.NoError(t, stop(), "cancellation is a clean stop")
	require.Less(t, time.Since(start), 10*time.Second)
	require.Empty(t, b.effects(t))
	require.Zero(t, b.processedRows(t))

	cfg.Handlers = map[string]consumer.Handler{"item.ok": record}
	c2, err := consumer.New(cfg)
	require.NoError(t, err)
	run(t, c2)
	require.Eventually(t, func() bool { return len(b.effects(t)) == 1 }, 20*time.Second, 20*time.Millisecond)
	// The counter moves just after the commit that made the effect visible.
	require.Eventually(t, func() bool { return c2.Stats().Processed == 1 }, 5*time.Second, 10*time.Millisecond)
}

// Two members share the partitions; members join and leave while records
// flow. Every event is applied once.
func TestConsumerRebalances(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(map[string]consumer.Handler{"item.ok": func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		time.Sleep(time.Millisecond) // keep work in flight while the group moves
		return record(ctx, tx, ev)
	}})
	cfg.BatchSize = 5
	cfg.MaxPollRecords = 20
	newConsumer := func() *consumer.Consumer {
		c, err := consumer.New(cfg)
		require.NoError(t, err)
		return c
	}
	p := b.producer(t)
	next := int64(1)
	send := func(n int) {
		var recs []*kgo.Record
		for range n {
			recs = append(recs, event("t", int32(next%3), next, "item.ok", `{}`))
			next++
		}
		produce(t, p, recs...)
	}
	c1, c2, c3 := newConsumer(), newConsumer(), newConsumer()
	send(150)
	stop1 := run(t, c1)
	require.Eventually(t, func() bool { return c1.Stats().Processed > 0 }, 20*time.Second, 10*time.Millisecond)
	stop2 := run(t, c2) // joins: partitions move while c1 works
	send(150)
	require.Eventually(t, func() bool { return len(b.effects(t)) >= 200 }, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, stop1()) // leaves: its partitions go to c2
	run(t, c3)
	send(150)
	require.Eventually(t, func() bool { return len(b.effects(t)) == 450 }, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, stop2())
	for k, n := range b.effects(t) {
		require.Equal(t, 1, n, "event %s applied %d times", k, n)
	}
	var processed int64
	for _, c := range []*consumer.Consumer{c1, c2, c3} {
		processed += c.Stats().Processed
	}
	require.EqualValues(t, 450, processed, "each event is processed by exactly one member, once")
	require.Equal(t, 450, b.processedRows(t))
}

func TestConsumerConfigErrors(t *testing.T) {
	t.Parallel()
	b := dbOnly(t)
	h := map[string]consumer.Handler{"a.b": record}
	good := func() consumer.Config {
		return consumer.Config{Name: "x", Pool: b.db.Pool, Client: kafka.ClientConfig{Brokers: []string{"127.0.0.1:9092"}}, Topics: []string{"a"}, Handlers: h}
	}
	_, err := consumer.New(good())
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		mod  func(*consumer.Config)
		want string
	}{
		{"empty name", func(c *consumer.Config) { c.Name = "" }, "Name is empty"},
		{"nil pool", func(c *consumer.Config) { c.Pool = nil }, "Pool is nil"},
		{"no topics", func(c *consumer.Config) { c.Topics = nil }, "no Topics"},
		{"bad topic", func(c *consumer.Config) { c.Topics = []string{"a b"} }, "Kafka topics use only"},
		{"topic twice", func(c *consumer.Config) { c.Topics = []string{"a", "a"} }, "listed twice"},
		{"no handlers", func(c *consumer.Config) { c.Handlers = nil }, "no handlers"},
		{"nil handler", func(c *consumer.Config) { c.Handlers = map[string]consumer.Handler{"a.b": nil} }, `handler for event type "a.b" is nil`},
		{"nil middleware", func(c *consumer.Config) { c.Middleware = []consumer.Middleware{nil} }, "Middleware[0] is nil"},
		{"no brokers", func(c *consumer.Config) { c.Client.Brokers = nil }, "no brokers"},
		{"dlq is input", func(c *consumer.Config) {
			c.Topics = []string{"a", "a.dlq"}
		}, "which this consumer also reads"},
		{"bad dlq", func(c *consumer.Config) { c.DeadLetterTopic = func(string) string { return "" } }, "dead-letter topic"},
		{"negative attempts", func(c *consumer.Config) { c.MaxAttempts = -1 }, "MaxAttempts is -1"},
		{"negative backoff", func(c *consumer.Config) { c.BackoffMin = -time.Second }, "BackoffMin is -1s"},
		{"backoff inverted", func(c *consumer.Config) { c.BackoffMin, c.BackoffMax = time.Second, time.Millisecond }, "BackoffMax (1ms) is below BackoffMin (1s)"},
		{"batch too big", func(c *consumer.Config) { c.BatchSize = 1 << 20 }, "BatchSize is"},
		{"negative concurrency", func(c *consumer.Config) { c.Concurrency = -2 }, "Concurrency is -2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := good()
			tc.mod(&cfg)
			_, err := consumer.New(cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}

	c, err := consumer.New(good())
	require.NoError(t, err)
	cfg := c.Config()
	require.Equal(t, "x", cfg.Group)
	require.Equal(t, 5, cfg.MaxAttempts)
	require.Equal(t, 100*time.Millisecond, cfg.BackoffMin)
	require.Equal(t, 5*time.Second, cfg.BackoffMax)
	require.Equal(t, "a.dlq", cfg.DeadLetterTopic("a"))
	require.Equal(t, 100, cfg.BatchSize)

	// Run twice is refused; a missing processed table stops Run at once.
	empty := dbOnly(t)
	_, err = empty.db.Pool.Exec(context.Background(), "DROP TABLE "+empty.db.Tables.ProcessedIdent())
	require.NoError(t, err)
	cfg = good()
	cfg.Pool, cfg.Tables = empty.db.Pool, empty.db.Tables
	c, err = consumer.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.ErrorContains(t, c.Run(ctx), "outbox migrate")
	require.ErrorContains(t, c.Run(ctx), "already called")
}

func TestRecoverAndChain(t *testing.T) {
	t.Parallel()
	var order []string
	mw := func(name string) consumer.Middleware {
		return func(next consumer.Handler) consumer.Handler {
			return func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
				order = append(order, name)
				return next(ctx, tx, ev)
			}
		}
	}
	h := consumer.Chain(func(context.Context, pgx.Tx, consumer.Event) error { panic(fmt.Sprintf("bad %d", 1)) },
		consumer.Recover(), mw("outer"), mw("inner"))
	err := h(context.Background(), nil, consumer.Event{})
	var pe *consumer.PanicError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "bad 1", pe.Value)
	require.Equal(t, []string{"outer", "inner"}, order)

	require.Nil(t, consumer.Permanent(nil))
	require.True(t, consumer.IsPermanent(fmt.Errorf("wrapped: %w", consumer.Permanent(errors.New("x")))))
	require.False(t, consumer.IsPermanent(errors.New("x")))
}
