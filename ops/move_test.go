package ops_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/opstest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
)

// moveLoad is producers writing all the time: goroutines, each emitting
// one to three events per transaction for aggregates of a shared set,
// until stopped. Every committed id is kept; any failed transaction fails
// the test (a move must never make producers fail).
type moveLoad struct {
	mu     sync.Mutex
	ids    []int64
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startLoad(t *testing.T, db *pgtest.DB, producers, aggregates int) *moveLoad {
	t.Helper()
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	aggs := make([]uuid.UUID, aggregates)
	for i := range aggs {
		aggs[i] = uuid.New()
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &moveLoad{cancel: cancel}
	for g := range producers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				var got []int64
				// One EmitBatch per transaction: it takes its aggregates'
				// locks in sorted order, where separate Emits for several
				// aggregates in another order can deadlock with another
				// producer's (docs/producers.md), which is no fault of the move.
				err := pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
					var events []outbox.Event
					for k := range 1 + (i+g)%3 {
						events = append(events, outbox.Event{AggregateID: aggs[(i*7+g*13+k)%len(aggs)], Type: "order.placed", Payload: map[string]int{"g": g, "i": i}})
					}
					ids, err := p.EmitBatch(context.Background(), tx, events)
					got = ids
					return err
				})
				if err != nil {
					t.Errorf("producer %d: a transaction failed during the move: %v", g, err)
					return
				}
				l.mu.Lock()
				l.ids = append(l.ids, got...)
				l.mu.Unlock()
			}
		}()
	}
	t.Cleanup(l.stop)
	return l
}

// stop ends the load and returns every committed id.
func (l *moveLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

func (l *moveLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}

// waitEmitted waits until the load has committed at least n more events.
func (l *moveLoad) waitEmitted(t *testing.T, n int) {
	t.Helper()
	want := l.count() + n
	require.Eventually(t, func() bool { return l.count() >= want }, 60*time.Second, 5*time.Millisecond)
}

// checkPublished reads the topic until every committed id arrived, and
// checks per-aggregate order in what a consumer reads; it returns the
// at-least-once redeliveries it saw.
func (l *moveLoad) checkPublished(t *testing.T, broker *devkafka.Broker) (duplicates int) {
	t.Helper()
	l.mu.Lock()
	ids := append([]int64(nil), l.ids...)
	l.mu.Unlock()
	recs := kafkatest.Collect(t, broker.Addr(), len(ids), 90*time.Second, "order")
	seen := map[int64]int{}
	for _, r := range recs {
		seen[r.EventID]++
	}
	for _, id := range ids {
		require.NotZero(t, seen[id], "event %d was committed and never published", id)
	}
	require.Len(t, seen, len(ids), "events were published that no producer committed")
	kafkatest.CheckOrder(t, recs, func(id int64) int64 { return id })
	return len(recs) - len(seen)
}

// guardHolds checks the guards on the moved table: a chosen id and a row
// the relay cannot publish are refused.
func guardHolds(t *testing.T, db *pgtest.DB) {
	t.Helper()
	ctx := context.Background()
	var pgErr *pgconn.PgError
	_, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+" (id, aggregate_id, type, payload) VALUES (1, gen_random_uuid(), 'order.placed', '{}')")
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "428C9", pgErr.Code)
	_, err = db.Pool.Exec(ctx, "INSERT INTO "+db.Tables.OutboxIdent()+" (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'bad topic.x', '{}')")
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "23514", pgErr.Code)
	require.Equal(t, db.Tables.Outbox+"_type_topic", pgErr.ConstraintName)
}

func layoutOf(t *testing.T, m *migrate.Migrator, db *pgtest.DB) migrate.Layout {
	t.Helper()
	p, err := m.Partitioning(context.Background(), db.Pool)
	require.NoError(t, err)
	return p.Layout
}

// The move both ways under load, with a polling relayer publishing to
// Kafka throughout: producers in four goroutines keep emitting for 40
// aggregates while the outbox is converted to the partitioned layout and
// reverted to the plain one. Every committed event is published, none
// that was not; per aggregate, a consumer reads them in commit order
// (redeliveries counted, allowed as at-least-once); no producer's
// transaction fails; the guards refuse bad inserts after each move.
func TestMoveBothWaysUnderLoadWithAPollingRelay(t *testing.T) {
	t.Parallel()
	b := opstest.Setup(t)
	ctx := context.Background()
	m, err := migrate.New(b.DB.Tables)
	require.NoError(t, err)
	r, err := relay.New(b.RelayConfig(t, b.Client(t)))
	require.NoError(t, err)
	opstest.RunRelayer(t, r)
	load := startLoad(t, b.DB, 4, 40)
	cfg := migrate.MoveConfig{Settings: migrate.PartitionSettings{Width: 100_000}, Logger: opstest.Logger(t)}

	load.waitEmitted(t, 500)
	res, err := m.Convert(ctx, b.DB.Pool, cfg)
	require.NoError(t, err)
	require.Equal(t, []string{migrate.StepBound, migrate.StepValidate, migrate.StepSwap}, res.Done)
	require.Equal(t, migrate.LayoutPartitioned, layoutOf(t, m, b.DB))
	load.waitEmitted(t, 500)
	guardHolds(t, b.DB)

	back, err := m.Revert(ctx, b.DB.Pool, cfg)
	require.NoError(t, err)
	require.Equal(t, migrate.LayoutPlain, layoutOf(t, m, b.DB))
	load.waitEmitted(t, 500)
	guardHolds(t, b.DB)
	load.stop()

	dups := load.checkPublished(t, b.Broker)
	t.Logf("%d events committed across both moves (%d pending rows copied by the revert), all published in per-aggregate order; %d redeliveries", load.count(), back.Copied, dups)
}
