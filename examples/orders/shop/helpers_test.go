package shop_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/consumer"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/examples/orders/shop"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

type bundle struct {
	db       *pgtest.DB
	broker   *devkafka.Broker
	producer *outbox.Producer
}

func setupProducer(t *testing.T, db *pgtest.DB) *outbox.Producer {
	t.Helper()
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	return p
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 12})
	require.NoError(t, shop.Migrate(context.Background(), db.Pool))
	b, err := devkafka.Start(devkafka.Config{Partitions: 4, Opts: []kfake.Opt{kfake.GroupMinSessionTimeout(100 * time.Millisecond)}})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	return &bundle{db: db, broker: b, producer: setupProducer(t, db)}
}

// placeOrders places n orders for a few customers from several goroutines;
// about one in ten reuses an order id already placed and must fail. It
// returns the ids of the events of the orders that committed.
func (b *bundle) placeOrders(t *testing.T, n int) []int64 {
	t.Helper()
	customers := make([]uuid.UUID, 17)
	for i := range customers {
		customers[i] = uuid.New()
	}
	var (
		mu     sync.Mutex
		placed []uuid.UUID
		ids    []int64
		dups   int
		wg     sync.WaitGroup
	)
	work := make(chan int)
	for range 6 {
		wg.Go(func() {
			for i := range work {
				o := shop.Order{ID: uuid.New(), CustomerID: customers[i%len(customers)], TotalCents: int64(i*37%5000 + 99)}
				mu.Lock()
				dup := i%10 == 9 && len(placed) > 0
				if dup {
					o.ID = placed[i%len(placed)]
				}
				mu.Unlock()
				id, err := shop.PlaceOrder(context.Background(), b.db.Pool, b.producer, o)
				mu.Lock()
				if dup {
					if !shop.IsDuplicate(err) {
						t.Errorf("order %d reuses id %s: want a duplicate error, got %v", i, o.ID, err)
					}
					dups++
				} else if err != nil {
					t.Errorf("order %d: %v", i, err)
				} else {
					placed = append(placed, o.ID)
					ids = append(ids, id)
				}
				mu.Unlock()
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	require.NotZero(t, dups)
	require.Len(t, ids, n-dups)
	return ids
}

// relayer runs the real relayer on the bundle until the test ends.
func (b *bundle) relayer(t *testing.T) *relay.Relayer {
	t.Helper()
	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{b.broker.Addr()},
		Opts: []kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	r, err := relay.New(relay.Config{
		Common:       relay.Common{Pool: b.db.Pool, Sink: kafkapub.NewPublisher(client, kafkapub.PublisherConfig{}), Tables: b.db.Tables, BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond},
		PollInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Error("relayer did not stop within 20s")
		}
	})
	return r
}

func (b *bundle) pending(t *testing.T) int {
	return b.count(t, "SELECT count(*) FROM "+b.db.Tables.OutboxIdent()+" WHERE dispatched_at IS NULL")
}

func (b *bundle) waitDrained(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 20*time.Second, 10*time.Millisecond, "outbox did not drain")
}

// redeliver sends the events whose ids match where again: the relayer
// publishes every pending row, dispatched or not before.
func (b *bundle) redeliver(t *testing.T, where string) int {
	t.Helper()
	tag, err := b.db.Pool.Exec(context.Background(), "UPDATE "+b.db.Tables.OutboxIdent()+" SET dispatched_at = NULL WHERE "+where)
	require.NoError(t, err)
	return int(tag.RowsAffected())
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func (b *bundle) processed(t *testing.T) int {
	return b.count(t, "SELECT count(*) FROM "+b.db.Tables.ProcessedIdent()+" WHERE consumer = $1", shop.LoyaltyConsumer)
}

func (b *bundle) points(t *testing.T) shop.Points {
	t.Helper()
	p, err := shop.CheckPoints(context.Background(), b.db.Pool)
	require.NoError(t, err)
	return p
}

// pointsOfProcessed is what the loyalty consumer should have awarded for
// the events recorded as processed: effects and dedupe rows must agree at
// every moment, crash or not.
func (b *bundle) pointsOfProcessed(t *testing.T) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT coalesce(sum((o.payload->>'total_cents')::int8 / $2), 0)::int8
FROM `+b.db.Tables.OutboxIdent()+` o JOIN `+b.db.Tables.ProcessedIdent()+` p ON p.event_id = o.id AND p.consumer = $1 AND p.source = ''`,
		shop.LoyaltyConsumer, shop.CentsPerPoint).Scan(&n))
	return n
}

// loyalty builds the loyalty consumer; mod adjusts its config.
func (b *bundle) loyalty(t *testing.T, mod func(*consumer.Config)) *consumer.Consumer {
	t.Helper()
	cfg := consumer.Config{
		Name:   shop.LoyaltyConsumer,
		Pool:   b.db.Pool,
		Tables: b.db.Tables,
		Client: kafka.ClientConfig{Brokers: []string{b.broker.Addr()}, Opts: []kgo.Opt{
			kgo.SessionTimeout(1500 * time.Millisecond),
			kgo.HeartbeatInterval(100 * time.Millisecond),
			kgo.FetchMaxWait(100 * time.Millisecond),
		}},
		Topics:     []string{shop.Topic},
		Handlers:   shop.Handlers(),
		BackoffMin: time.Millisecond,
		BackoffMax: 20 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	c, err := consumer.New(cfg)
	require.NoError(t, err)
	return c
}

// start runs c; stop cancels its context, and wait returns Run's error,
// failing the test if Run does not return within 30s.
func start(t *testing.T, c *consumer.Consumer) (stop func(), wait func() error) {
	t.Helper()
	return startCtx(t, context.Background(), c)
}

// startCtx is start with Run's context derived from parent.
func startCtx(t *testing.T, parent context.Context, c *consumer.Consumer) (stop func(), wait func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	wait = func() error {
		once.Do(func() {
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Error("consumer did not stop within 30s")
			}
		})
		return err
	}
	t.Cleanup(func() { cancel(); _ = wait() })
	return cancel, wait
}
