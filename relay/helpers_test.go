package relay_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/devkafka"
	"github.com/pgoutbox/outbox/internal/kafkatest"
	"github.com/pgoutbox/outbox/internal/pgtest"
	"github.com/pgoutbox/outbox/kafka"
	"github.com/pgoutbox/outbox/migrate"
	"github.com/pgoutbox/outbox/relay"
	"github.com/pgoutbox/outbox/relay/kafkapub"
)

type bundle struct {
	db       *pgtest.DB
	broker   *devkafka.Broker
	producer *outbox.Producer
}

func setup(t *testing.T, brokerOpts ...kfake.Opt) *bundle {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{MaxConns: 16})
	b, err := devkafka.Start(devkafka.Config{Partitions: 6, Opts: brokerOpts})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	p, err := outbox.NewProducer(outbox.Config{Tables: db.Tables})
	require.NoError(t, err)
	return &bundle{db: db, broker: b, producer: p}
}

// relayer builds a relayer on the bundle's table and broker; mod adjusts
// its config.
func (b *bundle) relayer(t *testing.T, mod func(*relay.Config)) *relay.Relayer {
	t.Helper()
	cfg := relay.Config{
		Common:       relay.Common{Pool: b.db.Pool, Sink: b.publisher(t), Tables: b.db.Tables, BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond},
		PollInterval: 50 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := relay.New(cfg)
	require.NoError(t, err)
	return r
}

// publisher builds a Kafka publisher on the bundle's broker; opts go to its
// client after the test defaults.
func (b *bundle) publisher(t *testing.T, opts ...kgo.Opt) *kafkapub.Publisher {
	t.Helper()
	client, err := kafkapub.NewPublisherClient(kafka.ClientConfig{Brokers: []string{b.broker.Addr()},
		Opts: append([]kgo.Opt{kgo.RecordDeliveryTimeout(5 * time.Second)}, opts...)})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	return kafkapub.NewPublisher(client, kafkapub.PublisherConfig{})
}

// holds reads the failures table: the rows relayers held, in id order.
func (b *bundle) holds(t *testing.T) []relay.Hold {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT event_id, aggregate_id, type, reason, error, attempts, coalesce(held_until, 'epoch')
		FROM `+migrate.FailuresIdent(b.db.Tables)+` ORDER BY event_id`)
	require.NoError(t, err)
	holds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (relay.Hold, error) {
		var h relay.Hold
		return h, r.Scan(&h.EventID, &h.AggregateID, &h.Type, &h.Reason, &h.Err, &h.Attempts, &h.Until)
	})
	require.NoError(t, err)
	return holds
}

// run starts r in the background; the returned stop cancels it and waits.
func run(t *testing.T, r *relay.Relayer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("relayer did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// pending counts rows not yet dispatched.
func (b *bundle) pending(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.db.Tables.OutboxIdent()+" WHERE dispatched_at IS NULL").Scan(&n))
	return n
}

func (b *bundle) waitDrained(t *testing.T, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, timeout, 20*time.Millisecond, "outbox did not drain")
}

// emit commits one event per call, in its own transaction.
func (b *bundle) emit(t *testing.T, agg uuid.UUID, typ string, payload any) int64 {
	t.Helper()
	var id int64
	err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = b.producer.Emit(context.Background(), tx, outbox.Event{AggregateID: agg, Type: typ, Payload: payload})
		return err
	})
	require.NoError(t, err)
	return id
}

// record is what a test reads back from the broker.
type record = kafkatest.Record

// consume reads every record of topics from the beginning until want
// records arrived (and a short quiet period more, so duplicates are seen),
// or fails after timeout.
func (b *bundle) consume(t *testing.T, want int, timeout time.Duration, topics ...string) []record {
	t.Helper()
	return kafkatest.Collect(t, b.broker.Addr(), want, timeout, topics...)
}

// checkOrder asserts that each key lives in exactly one partition and that,
// per key, the first delivery of each event id comes in ascending id order.
// That is the order a deduplicating consumer applies events in: at-least-once
// re-sends (a suffix delivered again) pass, an event whose first delivery
// comes after a later event's does not.
func checkOrder(t *testing.T, recs []record) {
	t.Helper()
	kafkatest.CheckOrder(t, recs, func(id int64) int64 { return id })
}

// appPool opens a pool on the test's schema whose connections carry a
// unique application_name, so a test can find, and kill, exactly the
// backends of one relayer (its LISTEN connection included: it copies the
// pool's config) in pg_stat_activity.
func (b *bundle) appPool(t *testing.T, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	app := "relay_test_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, app
}

// terminate kills every backend named app (filter narrows them, e.g.
// "state = 'idle in transaction'") and waits until they are gone, so the
// next statement on their connections fails for certain. It returns how
// many it killed.
func (b *bundle) terminate(t *testing.T, app, filter string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	where := "application_name = $1"
	if filter != "" {
		where += " AND " + filter
	}
	// Materialized first: in a plain WHERE, Postgres may call
	// pg_terminate_backend on rows before the other conditions rule them out.
	rows, err := b.db.Pool.Query(ctx, "WITH victims AS MATERIALIZED (SELECT pid FROM pg_stat_activity WHERE "+where+
		" AND pid <> pg_backend_pid()) SELECT pid FROM victims WHERE pg_terminate_backend(pid)", app)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		err := b.db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", pids).Scan(&n)
		return err == nil && n == 0
	}, 10*time.Second, 10*time.Millisecond, "terminated backends of %s did not exit", app)
	return len(pids)
}

// listening reports whether a backend named app holds a LISTEN.
func (b *bundle) listening(t *testing.T, app string) bool {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'", app).Scan(&n))
	return n > 0
}

// preload inserts n pending rows with raw SQL, aggregate g % aggregates for
// the g-th row: quicker than the producer when the producer is not what
// is tested.
func (b *bundle) preload(t *testing.T, n, aggregates int, typ string) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO `+b.db.Tables.OutboxIdent()+` (aggregate_id, type, payload)
		SELECT md5($3 || (g % $2)::text)::uuid, $4, jsonb_build_object('n', g) FROM generate_series(1, $1) g ORDER BY g`,
		n, aggregates, b.db.Tables.Schema, typ)
	require.NoError(t, err)
}

// writeLoad commits events events on aggregates aggregates from writers
// goroutines, in transactions of 1 to 5 events (EmitBatch); one
// transaction in ten is rolled back instead. It returns the aggregate of
// every committed event by id. It blocks until done; run it beside
// relayers to test them under concurrent writes.
func (b *bundle) writeLoad(t *testing.T, events, aggregates, writers int, typ string) map[int64]uuid.UUID {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The writers' own durability is not under test, and on a small
	// machine an fsync per commit makes them the slowest part.
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.MaxConns = int32(writers)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	aggs := make([]uuid.UUID, aggregates)
	for i := range aggs {
		aggs[i] = uuid.New()
	}
	var mu sync.Mutex
	committed := make(map[int64]uuid.UUID, events)
	var wg sync.WaitGroup
	for w := range writers {
		share := events / writers
		if w < events%writers {
			share++
		}
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 42))
			for done, txn := 0, 0; done < share; txn++ {
				k := min(1+rnd.IntN(5), share-done)
				batch := make([]outbox.Event, k)
				for i := range batch {
					batch[i] = outbox.Event{AggregateID: aggs[rnd.IntN(len(aggs))], Type: typ,
						Payload: map[string]any{"writer": w, "txn": txn}, Headers: map[string]string{"writer": strconv.Itoa(w)}}
				}
				rollback := txn%10 == 9
				var ids []int64
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					if ids, err = b.producer.EmitBatch(ctx, tx, batch); err != nil {
						return err
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				if rollback && errors.Is(err, errRollback) {
					continue
				}
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				mu.Lock()
				for i, id := range ids {
					committed[id] = batch[i].AggregateID
				}
				mu.Unlock()
				done += k
			}
		})
	}
	wg.Wait()
	return committed
}

var errRollback = errors.New("rolled back on purpose")

// checkDelivered asserts recs hold every committed event at least once,
// nothing that was not committed, each under its aggregate's key, in
// per-aggregate order (checkOrder). It returns the number of duplicates.
func checkDelivered(t *testing.T, committed map[int64]uuid.UUID, recs []record) (duplicates int) {
	t.Helper()
	seen := make(map[int64]bool, len(committed))
	for _, r := range recs {
		agg, ok := committed[r.EventID]
		require.True(t, ok, "event %d reached the broker but was never committed", r.EventID)
		require.Equal(t, agg.String(), r.Key, "event %d has the wrong key", r.EventID)
		if seen[r.EventID] {
			duplicates++
		}
		seen[r.EventID] = true
	}
	var missing []int64
	for id := range committed {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	slices.Sort(missing)
	require.Empty(t, missing, "%d committed events never reached the broker", len(missing))
	checkOrder(t, recs)
	return duplicates
}

// emitSpread commits n events round-robin over aggregates, a few per
// transaction, and returns the aggregate of each by id.
func (b *bundle) emitSpread(t *testing.T, n, aggregates int, typ string) map[int64]uuid.UUID {
	t.Helper()
	ctx := context.Background()
	aggs := make([]uuid.UUID, aggregates)
	for i := range aggs {
		aggs[i] = uuid.New()
	}
	committed := make(map[int64]uuid.UUID, n)
	for i := 0; i < n; i += 50 {
		batch := make([]outbox.Event, 0, 50)
		for j := i; j < min(i+50, n); j++ {
			batch = append(batch, outbox.Event{AggregateID: aggs[j%aggregates], Type: typ, Payload: map[string]int{"n": j}})
		}
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			ids, err := b.producer.EmitBatch(ctx, tx, batch)
			for k, id := range ids {
				committed[id] = batch[k].AggregateID
			}
			return err
		}))
	}
	return committed
}

// onBatch makes a function a relay.BatchHook.
type onBatch func(relay.BatchResult)

func (f onBatch) OnBatch(res relay.BatchResult) { f(res) }
