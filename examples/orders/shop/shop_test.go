package shop_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/examples/orders/shop"
	"github.com/pgoutbox/outbox/internal/commithook"
	"github.com/pgoutbox/outbox/internal/pgtest"
)

func TestPlaceOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	require.NoError(t, shop.Migrate(ctx, db.Pool))
	require.NoError(t, shop.Migrate(ctx, db.Pool), "Migrate twice is a no-op")
	b := &bundle{db: db}
	p := setupProducer(t, db)

	o := shop.Order{ID: uuid.New(), CustomerID: uuid.New(), TotalCents: 1299}
	id, err := shop.PlaceOrder(ctx, db.Pool, p, o)
	require.NoError(t, err)
	require.Positive(t, id)
	var (
		agg          uuid.UUID
		typ, payload string
	)
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT aggregate_id, type, payload::text FROM "+db.Tables.OutboxIdent()+" WHERE id = $1", id).Scan(&agg, &typ, &payload))
	require.Equal(t, o.ID, agg)
	require.Equal(t, shop.EventOrderPlaced, typ)
	require.JSONEq(t, `{"order_id":"`+o.ID.String()+`","customer_id":"`+o.CustomerID.String()+`","total_cents":1299}`, payload)

	// A second order with the same id fails on the unique key and rolls
	// back: no second order, no second event.
	_, err = shop.PlaceOrder(ctx, db.Pool, p, shop.Order{ID: o.ID, CustomerID: uuid.New(), TotalCents: 5})
	require.True(t, shop.IsDuplicate(err), "got %v", err)
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM orders"))
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM "+db.Tables.OutboxIdent()))

	for _, bad := range []shop.Order{
		{CustomerID: uuid.New(), TotalCents: 1},
		{ID: uuid.New(), TotalCents: 1},
		{ID: uuid.New(), CustomerID: uuid.New(), TotalCents: -1},
	} {
		_, err := shop.PlaceOrder(ctx, db.Pool, p, bad)
		require.ErrorIs(t, err, shop.ErrInvalidOrder)
	}
	_, err = shop.PlaceOrder(ctx, db.Pool, nil, o)
	require.ErrorContains(t, err, "producer is nil")
	require.False(t, shop.IsDuplicate(errors.New("x")))
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM "+db.Tables.OutboxIdent()))
}

func TestHandleOrderPlacedAwardsPointsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 4})
	require.NoError(t, shop.Migrate(ctx, db.Pool))
	b := &bundle{db: db}
	p := setupProducer(t, db)
	proc, err := consumer.NewProcessor(consumer.ProcessorConfig{Name: shop.LoyaltyConsumer, Pool: db.Pool, Tables: db.Tables})
	require.NoError(t, err)
	h := shop.Handlers()[shop.EventOrderPlaced]

	customer := uuid.New()
	for i, cents := range []int64{1299, 250, 99} { // 12 + 2 + 0 points
		o := shop.Order{ID: uuid.New(), CustomerID: customer, TotalCents: cents}
		id, err := shop.PlaceOrder(ctx, db.Pool, p, o)
		require.NoError(t, err)
		ev := consumer.Event{ID: id, Type: shop.EventOrderPlaced, AggregateID: o.ID,
			Payload: []byte(`{"order_id":"` + o.ID.String() + `","customer_id":"` + customer.String() + `","total_cents":` + itoa(cents) + `}`)}
		for range 3 {
			_, err := proc.Process(ctx, ev, h)
			require.NoError(t, err, "order %d", i)
		}
	}
	require.Equal(t, shop.Points{Orders: 3, Expected: 14, Awarded: 14}, b.points(t))
	require.True(t, b.points(t).OK())
	require.Equal(t, consumer.ProcessorStats{Processed: 3, Duplicates: 6}, proc.Stats())

	// An order the handler never saw shows up as a mismatch.
	_, err = shop.PlaceOrder(ctx, db.Pool, p, shop.Order{ID: uuid.New(), CustomerID: uuid.New(), TotalCents: 500})
	require.NoError(t, err)
	pts := b.points(t)
	require.False(t, pts.OK())
	require.Equal(t, shop.Points{Orders: 4, Expected: 19, Awarded: 14, Mismatched: 1}, pts)

	// A payload without a customer cannot be fixed by retrying.
	_, err = proc.Process(ctx, consumer.Event{ID: 999, Payload: []byte(`{"order_id":"` + uuid.NewString() + `","total_cents":100}`)}, h)
	require.True(t, consumer.IsPermanent(err), "got %v", err)
}

// Must-show 1: every event of a run is delivered twice, a third of them
// three times, through the real relayer, to two members of the loyalty
// group; the points equal the sum over the committed orders exactly.
func TestEveryEventDeliveredTwiceAwardsPointsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.placeOrders(t, 300)
	n := len(ids)

	c1, c2 := b.loyalty(t, nil), b.loyalty(t, nil)
	start(t, c1)
	start(t, c2)
	r := b.relayer(t)
	b.waitDrained(t)

	// Second delivery of everything, while the consumers work.
	require.Equal(t, n, b.redeliver(t, "true"))
	b.waitDrained(t)
	third := b.redeliver(t, "id % 3 = 0")
	require.Positive(t, third)
	b.waitDrained(t)
	deliveries := 2*n + third
	// The relayer counts a batch just after its commit drains the table.
	require.Eventually(t, func() bool { return r.Stats().Dispatched == int64(deliveries) }, 5*time.Second, 5*time.Millisecond,
		"relayer dispatched %d, want %d", r.Stats().Dispatched, deliveries)

	// Every delivery is processed or skipped (records abandoned at a
	// rebalance come again, so they can add to the count).
	require.Eventually(t, func() bool {
		s1, s2 := c1.Stats(), c2.Stats()
		return s1.Processed+s1.Duplicates+s2.Processed+s2.Duplicates >= int64(deliveries)
	}, 30*time.Second, 20*time.Millisecond, "consumers did not get every delivery: %+v %+v", c1.Stats(), c2.Stats())

	pts := b.points(t)
	require.True(t, pts.OK(), "points: %s", pts)
	require.EqualValues(t, n, pts.Orders)
	require.Positive(t, pts.Expected)
	require.Equal(t, n, b.processed(t))
	s1, s2 := c1.Stats(), c2.Stats()
	require.EqualValues(t, n, s1.Processed+s2.Processed, "each event processed once across the group")
	require.GreaterOrEqual(t, s1.Duplicates+s2.Duplicates, int64(deliveries-n))
	require.Zero(t, s1.DeadLettered+s2.DeadLettered)
	t.Logf("%d orders, %d deliveries; member 1 %+v, member 2 %+v; %s", n, deliveries, s1, s2, pts)
}

// Must-show 2, first half: the consumer is killed in the middle of a
// batch (its context cancelled and the transaction in flight cut off at
// once), then restarted in the same group; effects end exact.
func TestConsumerKilledMidBatchThenRestarted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.placeOrders(t, 300)
	b.relayer(t)
	b.waitDrained(t)

	var calls atomic.Int64
	kill := make(chan struct{})
	c1 := b.loyalty(t, func(cfg *consumer.Config) {
		cfg.BatchSize = 20
		cfg.ShutdownTimeout = time.Millisecond
		cfg.Middleware = []consumer.Middleware{func(next consumer.Handler) consumer.Handler {
			return func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
				if calls.Add(1) == 130 { // inside a batch transaction of up to 20 events
					close(kill)
					<-ctx.Done() // the transaction in flight is cut off
				}
				return next(ctx, tx, ev)
			}
		}}
	})
	stop, wait := start(t, c1)
	select {
	case <-kill:
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer never reached the kill point")
	}
	stop()
	require.NoError(t, wait(), "a cancelled consumer stops cleanly")

	done := b.processed(t)
	require.Positive(t, done)
	require.Less(t, done, len(ids))
	// A commit cut off by the kill may have landed without the consumer
	// hearing back, so its counter can be short of the rows.
	require.LessOrEqual(t, c1.Stats().Processed, int64(done))
	pts := b.points(t)
	require.Equal(t, b.pointsOfProcessed(t), pts.Awarded, "points match exactly the events recorded as processed")

	c2 := b.loyalty(t, nil)
	start(t, c2)
	require.Eventually(t, func() bool { return b.processed(t) == len(ids) }, 30*time.Second, 20*time.Millisecond)
	pts = b.points(t)
	require.True(t, pts.OK(), "points: %s", pts)
	// The counter moves just after the commit that made the row visible.
	require.Eventually(t, func() bool { return c2.Stats().Processed == int64(len(ids)-done) }, 5*time.Second, 10*time.Millisecond,
		"restart processed %d, want %d", c2.Stats().Processed, len(ids)-done)
	t.Logf("first run processed %d of %d before the kill; the restart processed %d, skipped %d duplicates", done, len(ids), c2.Stats().Processed, c2.Stats().Duplicates)
}

// Must-show 2, second half: a crash after the transactions committed but
// before the offsets did. The restarted consumer gets those records again
// and skips every one of them as a duplicate.
func TestCrashBetweenTransactionAndOffsetCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.placeOrders(t, 200)
	b.relayer(t)
	b.waitDrained(t)

	crash := errors.New("simulated crash")
	c1 := b.loyalty(t, nil)
	_, wait := startCtx(t, commithook.With(context.Background(), func(map[string]map[int32]int64) error { return crash }), c1)
	require.ErrorIs(t, wait(), crash)
	first := c1.Stats().Processed
	require.Positive(t, first)
	require.EqualValues(t, first, b.processed(t))
	require.Equal(t, b.pointsOfProcessed(t), b.points(t).Awarded)

	c2 := b.loyalty(t, nil)
	start(t, c2)
	require.Eventually(t, func() bool { return b.processed(t) == len(ids) }, 30*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		s := c2.Stats()
		return s.Processed+s.Duplicates == int64(len(ids))
	}, 10*time.Second, 20*time.Millisecond)
	s := c2.Stats()
	require.EqualValues(t, len(ids), s.Records)
	require.Equal(t, first, s.Duplicates, "every record the crashed run committed comes again and is skipped")
	require.EqualValues(t, int64(len(ids))-first, s.Processed)
	pts := b.points(t)
	require.True(t, pts.OK(), "points: %s", pts)
	t.Logf("crashed run processed %d of %d; the restart skipped %d duplicates and processed %d", first, len(ids), s.Duplicates, s.Processed)
}
